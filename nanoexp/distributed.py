"""This process's place in the tensor-parallel group."""

from __future__ import annotations

import torch.distributed as dist


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(x):
    if tp_size() > 1:
        dist.all_reduce(x)
    return x
