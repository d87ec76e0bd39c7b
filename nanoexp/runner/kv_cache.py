"""Sizing and allocating the paged KV cache of one rank (in the model's dtype, or fp8)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from nanoexp.config import EngineConfig, KnobError
from nanoexp.config.checks import machine_memory_gb
from nanoexp.kernels.base import FP8_DTYPE
from nanoexp.layers.attention import attention_layers


def create_kv_cache(
    config: EngineConfig,
    model: nn.Module,
    dtype: torch.dtype,
    device: torch.device,
    profile: Callable[[], None],
    reserve_bytes: int,
) -> torch.Tensor:
    """As many blocks as the config asks for, or as fit in memory after `profile` (a largest-size
    forward pass on CUDA) and a reserve; the same number on every rank. `dtype` is the model's."""
    dtype = FP8_DTYPE if config.cache.lossy else dtype
    layers, block_size = attention_layers(model), config.cache.block_size
    per_token = sum(2 * a.num_kv_heads * a.head_dim for a in layers)  # K and V, every layer
    bytes_per_block = per_token * block_size * dtype.itemsize
    num_blocks = blocks_for(config, bytes_per_block, device, profile, reserve_bytes)
    if config.parallel.tensor_parallel_size > 1:  # every rank uses the smallest number any rank can afford
        agreed = torch.tensor([num_blocks], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        num_blocks = int(agreed.item())
    if num_blocks < 1:
        raise ValueError(
            "no memory left for the KV cache: raise gpu_memory_utilization / cpu_kv_cache_gib "
            "or lower max_num_batched_tokens"
        )
    first = layers[0]
    shape = (len(layers), 2, num_blocks, block_size, first.num_kv_heads, first.head_dim)
    cache = torch.empty(shape, dtype=dtype, device=device)
    for i, layer in enumerate(layers):  # each layer's K and V caches are views
        layer.k_cache, layer.v_cache = cache[i, 0], cache[i, 1]
    return cache


def blocks_for(
    config: EngineConfig,
    bytes_per_block: int,
    device: torch.device,
    profile: Callable[[], None],
    reserve_bytes: int,
) -> int:
    """cache.num_blocks set by hand, once it fits in the device's whole memory (before allocating it). Else
    cpu_kv_cache_gib on a CPU; on CUDA, after `profile`, this process's share: utilization x total memory,
    minus its own peak usage so far and a reserve (CUDA graphs, sampler buffers), capped by what is free."""
    num_blocks = config.cache.num_blocks
    if num_blocks != -1:
        cuda = device.type == "cuda"
        capacity = torch.cuda.mem_get_info(device)[1] if cuda else machine_memory_gb() * 2**30
        if num_blocks * bytes_per_block > capacity:
            raise KnobError(
                "cache.num_blocks",
                num_blocks,
                f"<= {int(capacity // bytes_per_block)} (or -1 = from memory): a block takes "
                f"{bytes_per_block} bytes on this rank and the {device.type} device has "
                f"{capacity / 2**30:.1f} GiB",
            )
        return num_blocks
    if device.type == "cpu":
        budget = config.cache.cpu_kv_cache_gib * 2**30
    else:
        profile()
        free, total = torch.cuda.mem_get_info(device)
        peak, current = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
        by_utilization = total * config.cache.gpu_memory_utilization - peak
        budget = min(by_utilization, free - (peak - current)) - reserve_bytes
    return max(int(budget // bytes_per_block), 0)
