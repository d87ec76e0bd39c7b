"""Random inputs of the MoE expert kernels (kernels/triton_moe*.py), bf16-free shapes for the Triton
interpreter and Qwen3-30B-A3B's for the GPU: unquantized and block-scaled fp8 experts."""

from __future__ import annotations

import torch

from nanoexp.kernels.fp8_reference import BLOCK, quantize_weight
from nanoexp.kernels.moe_ref import Fp8ExpertScales, route
from nanoexp.layers.quantization import layout_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def moe_inputs(tokens, experts, top_k, hidden, inter, dtype, seed=0):
    """(x, w13, w2, routing weights, expert ids) on DEVICE."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, dtype)
    logits = torch.randn(tokens, experts, generator=gen).to(DEVICE, dtype)
    weights, ids = route(logits, top_k, renormalize=True)
    return x, w13, w2, weights, ids


def quantized_experts(experts: int, n: int, k: int, layout, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """`experts` random [n, k] weights in e4m3 at the layout's K offset, [E, n, k_padded], and their scales
    [E, scale rows, k_blocks] (each expert quantized in its own 128 x 128 blocks)."""
    weights, scales = [], []
    for _ in range(experts):
        w = torch.zeros(n, layout.k_padded)
        w[:, layout.k_offset : layout.k_offset + k] = torch.randn(n, k, generator=gen) / k**0.5
        q, s = quantize_weight(w)
        weights.append(q)
        scales.append(s.repeat_interleave(BLOCK, 0)[: n : layout.row_block])
    return torch.stack(weights).to(DEVICE), torch.stack(scales).to(DEVICE)


def fp8_moe_inputs(tokens, experts, top_k, hidden, inter, dtype, inter_start=0, seed=0):
    """(x, w13, w2, routing weights, ids, Fp8ExpertScales) of one rank holding rows [inter_start, +inter) of
    each expert's intermediate dim."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = layout_for(2 * inter, hidden, 0, [inter, inter])
    down = layout_for(hidden, inter, inter_start, [hidden])
    w13, s13 = quantized_experts(experts, 2 * inter, hidden, gate_up, gen)
    w2, s2 = quantized_experts(experts, hidden, inter, down, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    logits = torch.randn(tokens, experts, generator=gen).to(DEVICE, dtype)
    weights, ids = route(logits, top_k, renormalize=True)
    return x, w13, w2, weights, ids, Fp8ExpertScales(s13, s2, gate_up, down)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()
