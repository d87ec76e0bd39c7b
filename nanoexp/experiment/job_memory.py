"""Memory of one job, not of the process's lifetime: in a sweep of jobs in one process, the peak
resident set (CPU) and the peak of torch's device allocations (GPU) are reset when the job starts,
and the job's peak is split into weights, KV cache and the rest (activations, graphs, buffers,
the Python heap).

On Linux the peak resident set is reset through /proc/self/clear_refs (`5` resets VmHWM);
elsewhere the process's lifetime peak stands in, and `job_memory_scope` says so. Both figures
are this process's: with TP > 1 the ranks hold their weights in worker processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory

STATUS = Path("/proc/self/status")
CPU = torch.device("cpu")


class JobMemory:
    """Started before the engine is built; `summary(stats)` after the timed passes."""

    def __init__(self) -> None:
        reset = reset_peak_memory(CPU) == "resident"
        self.scope = "job" if reset else "process lifetime (no /proc/self/clear_refs)"
        self.rss_at_start = _status_bytes("VmRSS")
        self.device = _reset_device_peak()

    def summary(self, stats: dict) -> dict:
        """`job_peak_rss_bytes` (and `job_peak_device_bytes` on a GPU) and the split of the job's
        growth into `memory_weights_bytes`, `memory_kv_cache_bytes` and `memory_other_bytes`."""
        weights, kv = int(stats.get("weights_bytes", 0)), int(stats.get("kv_cache_bytes", 0))
        peak_rss = peak_memory_bytes(CPU)
        out = {"job_memory_scope": self.scope, "job_peak_rss_bytes": peak_rss}
        out["job_rss_at_start_bytes"] = self.rss_at_start
        out |= {"memory_weights_bytes": weights, "memory_kv_cache_bytes": kv}
        if self.device and stats.get("device") == "cuda":
            peak = _device_peak()
            out["job_peak_device_bytes"] = peak
            out["memory_other_bytes"] = max(0, peak - weights - kv)
        else:
            out["memory_other_bytes"] = max(0, peak_rss - self.rss_at_start - weights - kv)
        return out


def _status_bytes(field: str) -> int:
    """A `kB` field of /proc/self/status in bytes (0 off Linux)."""
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0


def _reset_device_peak() -> bool:
    """Resets torch's peak device allocation when CUDA is already started in this process (by an
    earlier job of the sweep; otherwise its peak starts with this job anyway). True on a GPU host."""
    if not torch.cuda.is_available():
        return False
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    return True


def _device_peak() -> int:
    return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_initialized() else 0
