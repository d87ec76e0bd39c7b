"""A job's memory (a sweep runs its jobs in one process): its peak, as weights, KV cache and the rest."""

from __future__ import annotations

import torch

from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory

CPU = torch.device("cpu")


class JobMemory:
    """Memory of one job (a sweep runs its jobs in one process): weights, KV cache and the rest."""

    def __init__(self) -> None:
        reset = reset_peak_memory(CPU) == "resident"
        self.scope = "job" if reset else "process lifetime (no /proc/self/clear_refs)"
        self.rss_at_start = peak_memory_bytes(CPU) if reset else 0  # a reset peak is the resident set now
        if torch.cuda.is_initialized():  # by an earlier job of the sweep; otherwise it starts now anyway
            torch.cuda.reset_peak_memory_stats()

    def summary(self, stats: dict) -> dict:
        """The job's peak RSS (and device allocations on a GPU), split into weights, KV cache and other."""
        weights, kv = int(stats.get("weights_bytes", 0)), int(stats.get("kv_cache_bytes", 0))
        peak_rss = peak_memory_bytes(CPU)
        out = {"job_memory_scope": self.scope, "job_peak_rss_bytes": peak_rss}
        out["job_rss_at_start_bytes"] = self.rss_at_start
        used = peak_rss - self.rss_at_start
        if stats.get("device") == "cuda":
            used = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_initialized() else 0
            out["job_peak_device_bytes"] = used
        elif stats.get("kv_cache_resident_bytes") is not None:  # the CPU split counts what is resident
            kv = int(stats["kv_cache_resident_bytes"])
        out |= {"memory_weights_bytes": weights, "memory_kv_cache_bytes": kv}
        out["memory_kv_cache_allocated_bytes"] = int(stats.get("kv_cache_bytes", 0))
        return out | {"memory_other_bytes": max(0, used - weights - kv)}
