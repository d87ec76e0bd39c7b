"""Sampled ids of an enqueued step, read back without blocking the launch of the next one."""

from __future__ import annotations

import torch


class PendingStep:
    """Starts a non-blocking copy of `tokens` to pinned host memory; `result()` waits for it."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens
        self.event = None
        if tokens.is_cuda:
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def result(self) -> list[int]:
        if self.event is None:
            return self.tokens.tolist()
        self.event.synchronize()
        return self.host.tolist()
