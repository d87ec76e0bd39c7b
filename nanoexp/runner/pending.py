"""Sampled ids of an enqueued step, read back without blocking the launch of the next one."""

from __future__ import annotations

import torch

MIN_CAPACITY = 256  # ids per pinned buffer; a larger step gets a buffer of its own size


class ReadbackPool:
    """Pinned host buffers and CUDA events for launched steps' read-back, reused: allocating them
    every step costs tens of microseconds a batch-1 decode step cannot spare
    (experiments/nanovllm_bench/runs/host_phases_53dfc1e.md)."""

    def __init__(self) -> None:
        self.free: list[tuple[torch.Tensor, torch.cuda.Event]] = []

    def take(self, count: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        for i, slot in enumerate(self.free):
            if slot[0].numel() >= count:
                return self.free.pop(i)
        host = torch.empty(max(count, MIN_CAPACITY), dtype=torch.int64, pin_memory=True)
        return host, torch.cuda.Event()


class PendingStep:
    """A non-blocking copy of `tokens` (int64) to pinned host memory; `result()` waits, then frees it."""

    def __init__(self, tokens: torch.Tensor, pool: ReadbackPool):
        self.tokens, self.pool = tokens, pool
        self.slot = None
        if tokens.is_cuda:
            self.slot = pool.take(tokens.numel())
            host, event = self.slot
            self.host = host[: tokens.numel()]
            self.host.copy_(tokens, non_blocking=True)
            event.record()

    def result(self) -> list[int]:
        if self.slot is None:
            return self.tokens.tolist()
        self.slot[1].synchronize()
        ids = self.host.tolist()
        self.pool.free.append(self.slot)
        self.slot = None
        return ids
