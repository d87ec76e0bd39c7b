"""This process's place in the tensor-parallel group, and the all-reduce its layers call."""

from __future__ import annotations

import torch
import torch.distributed as dist

from nanoexp.kernels.all_reduce import AllReduce, setup_all_reduce

_all_reduce: AllReduce | None = None  # installed by init_all_reduce; None: dist.all_reduce


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def init_all_reduce(
    choice: str, device: torch.device, dtype: torch.dtype, max_bytes: int
) -> AllReduce | None:
    """Installs this rank's all-reduce for `parallel.all_reduce=choice` (a collective call: every rank,
    after init_process_group, before CUDA-graph capture). A no-op returning None without TP."""
    global _all_reduce
    _all_reduce = setup_all_reduce(choice, None, device, dtype, max_bytes) if tp_size() > 1 else None
    return _all_reduce


def reset_all_reduce() -> None:
    global _all_reduce
    _all_reduce = None


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the TP ranks: in place on the NCCL/gloo path, a new tensor on the one-shot path."""
    if tp_size() == 1:
        return x
    if _all_reduce is not None:
        return _all_reduce(x)
    dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of x over the TP ranks, in place."""
    if tp_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_gather_stacked(x: torch.Tensor) -> torch.Tensor:
    """[world, *x.shape]: every rank's x, in rank order, on every rank."""
    out = torch.empty((tp_size(), *x.shape), dtype=x.dtype, device=x.device)
    if x.device.type == "cuda":
        dist.all_gather_into_tensor(out, x.contiguous())
    else:  # gloo has no all_gather_into_tensor
        dist.all_gather(list(out.unbind(0)), x.contiguous())
    return out
