"""Sizing and allocating the paged KV cache of one rank."""

from __future__ import annotations

import torch
from torch import nn

from nanoexp.layers.attention import Attention


def attention_layers(model: nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


def block_bytes(model: nn.Module, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers of this rank."""
    per_token = sum(2 * a.num_kv_heads * a.head_dim for a in attention_layers(model))
    return per_token * block_size * torch.empty(0, dtype=dtype).element_size()


def blocks_for_budget(budget_bytes: float, bytes_per_block: int) -> int:
    return max(int(budget_bytes // bytes_per_block), 0)


def cuda_kv_budget(device: torch.device, utilization: float, reserve_bytes: int) -> float:
    """This process's share: utilization x total memory, minus its own peak usage so far and a
    reserve (CUDA graphs, sampler buffers), capped by what the device has free."""
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device)
    current = torch.cuda.memory_allocated(device)
    by_utilization = total * utilization - peak - reserve_bytes
    return min(by_utilization, free - (peak - current) - reserve_bytes)


def allocate_kv_cache(
    model: nn.Module, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One tensor [layers, 2, blocks, block_size, kv_heads, head_dim]; each layer gets views."""
    layers = attention_layers(model)
    first = layers[0]
    cache = torch.empty(
        len(layers), 2, num_blocks, block_size, first.num_kv_heads, first.head_dim,
        dtype=dtype, device=device,
    )
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = cache[i, 0], cache[i, 1]
    return cache
