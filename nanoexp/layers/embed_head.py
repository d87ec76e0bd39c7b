"""Vocabulary-parallel input embedding and LM head."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanoexp.distributed import all_reduce, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary (padded so it divides evenly)."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.per_rank * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # read by loader.py

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        mine = loaded[self.vocab_start : self.vocab_start + self.per_rank]
        param.data[: mine.shape[0]].copy_(mine)
        param.data[mine.shape[0] :].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # indexing, not F.embedding: its CUDA kernel for up to 16 ids reads them one after another
        # (11.9 us for 16 tokens on an H200, against 1.5 us)
        if self.tp_size == 1:
            return self.weight[input_ids]
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.per_rank)
        out = self.weight[local * mine] * mine.unsqueeze(-1)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for the given hidden rows; rank 0 gathers the full vocabulary, others get None."""

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary columns (from token `vocab_start`), without the padding."""
        valid = min(self.per_rank, self.vocab_size - self.vocab_start)
        return F.linear(hidden, self.weight[:valid])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]  # logits, not rows
        logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            if self.tp_rank != 0:
                dist.gather(logits, None, dst=0)
                return None
            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            dist.gather(logits, parts, dst=0)
            logits = torch.cat(parts, dim=-1)
        return logits[..., : self.vocab_size]  # a view without the padding
