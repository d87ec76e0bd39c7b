"""Memory of one job, not of the process's lifetime (a sweep runs its jobs in one process): the peak
resident set and device allocations are reset when the job starts, and its peak is split into
weights, KV cache and the rest. Both are this process's: with TP > 1 the ranks are workers."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory

CPU = torch.device("cpu")


class JobMemory:
    """Started before the engine is built; `summary(stats)` after the timed passes."""

    def __init__(self) -> None:
        reset = reset_peak_memory(CPU) == "resident"
        self.scope = "job" if reset else "process lifetime (no /proc/self/clear_refs)"
        self.rss_at_start = _status_bytes("VmRSS")
        self.device = torch.cuda.is_available()
        if torch.cuda.is_initialized():  # by an earlier job of the sweep; otherwise it starts now anyway
            torch.cuda.reset_peak_memory_stats()

    def summary(self, stats: dict) -> dict:
        """The job's peak RSS (and device allocations on a GPU), split into weights, KV cache and other."""
        weights, kv = int(stats.get("weights_bytes", 0)), int(stats.get("kv_cache_bytes", 0))
        peak_rss = peak_memory_bytes(CPU)
        out = {"job_memory_scope": self.scope, "job_peak_rss_bytes": peak_rss}
        out["job_rss_at_start_bytes"] = self.rss_at_start
        out |= {"memory_weights_bytes": weights, "memory_kv_cache_bytes": kv}
        if self.device and stats.get("device") == "cuda":
            peak = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_initialized() else 0
            out["job_peak_device_bytes"] = peak
            out["memory_other_bytes"] = max(0, peak - weights - kv)
        else:
            out["memory_other_bytes"] = max(0, peak_rss - self.rss_at_start - weights - kv)
        return out


def _status_bytes(field: str) -> int:
    """A `kB` field of /proc/self/status in bytes (0 off Linux)."""
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0
