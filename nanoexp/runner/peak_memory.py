"""A process's peak memory since a reset: torch's peak allocation on a GPU, the peak resident set
on the CPU. Linux resets the resident peak (VmHWM) through /proc/self/clear_refs; where that does
not work, the CPU figure is the process's lifetime peak, and reset_peak_memory says so."""

from __future__ import annotations

import ctypes
import os
import re
import resource
import sys
from pathlib import Path

import torch

CLEAR_REFS, STATUS = "/proc/self/clear_refs", "/proc/self/status"
RESET_RESIDENT_PEAK = "5"  # proc(5): reset the peak resident set size to the current one


def reset_peak_memory(device: torch.device) -> str:
    """Starts counting the peak anew; returns what peak_memory_bytes then measures: `allocated`
    (torch's allocations), `resident` (the resident set) or `resident_lifetime` (no reset here)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "allocated"
    try:
        Path(CLEAR_REFS).write_text(RESET_RESIDENT_PEAK)
    except OSError:
        return "resident_lifetime"  # not Linux, or not allowed
    return "resident" if _resident_peak() is not None else "resident_lifetime"


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    resident = _resident_peak()
    if resident is not None:
        return resident
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the lifetime peak
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _resident_peak() -> int | None:
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", Path(STATUS).read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def resident_bytes(tensor: torch.Tensor) -> int | None:
    """How many bytes of a CPU tensor's memory are resident (mincore(2) over its pages): an allocated but
    never touched KV cache is mostly not. None where mincore is unavailable or the tensor is on a GPU."""
    if tensor.device.type != "cpu" or not sys.platform.startswith("linux") or tensor.nbytes == 0:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    start = tensor.data_ptr() - tensor.data_ptr() % page
    length = tensor.data_ptr() + tensor.nbytes - start
    pages = (ctypes.c_ubyte * -(-length // page))()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), pages) != 0:
            return None
    except (OSError, AttributeError):
        return None
    resident = sum(1 for flag in bytes(pages) if flag & 1)
    return min(resident * page, tensor.nbytes)
