"""The MoE experts in torch: routing and the per-expert SwiGLU MLPs, computed as transformers'
Qwen3MoeForCausalLM computes them (with fp8 experts, each projection in the W8A8 arithmetic of
kernels/fp8_reference.py). The CPU path and the oracle of the Triton kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nanoexp.kernels.fp8_reference import Fp8Layout, w8a8_reference


@dataclass(frozen=True)
class Fp8ExpertScales:
    """Block-scaled fp8 experts: w13's scales [E, rows, K blocks] in the `gate_up` layout (one expert's
    [2I, H] weight), w2's in the `down` layout ([H, I]). down_amax: the down projection's activation amax per
    slot and 128-group shared over the TP ranks whose shards straddle a group (None: each rank's own)."""

    w13: Tensor
    w2: Tensor
    gate_up: Fp8Layout
    down: Fp8Layout
    down_amax: Callable[[Tensor], Tensor | None] | None = None


def route(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """(weights [T, top_k] in the logits' dtype, expert ids [T, top_k] int64): softmax over the experts in
    float32, torch.topk (its tie-breaking is transformers'), renormalized to sum 1 when `renormalize`."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def experts_reference(
    x: Tensor, w13: Tensor, w2: Tensor, weights: Tensor, local_ids: Tensor, fp8: Fp8ExpertScales | None = None
) -> Tensor:
    """sum_k weights[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) over this rank's experts e = ids[t, k]
    (ids outside [0, experts) belong to other ranks and add nothing). w13 [E, 2I, H] holds gate then up,
    w2 [E, H, I]. Experts are added in id order, each token's contribution once, as transformers does."""
    if fp8 is not None:
        return fp8_experts_reference(x, w13, w2, weights, local_ids, fp8)
    out = torch.zeros_like(x)
    for expert in range(w13.shape[0]):
        tokens, slots = torch.where(local_ids == expert)
        if tokens.numel() == 0:
            continue
        gate, up = F.linear(x[tokens], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert]) * weights[tokens, slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def fp8_experts_reference(
    x: Tensor, w13: Tensor, w2: Tensor, weights: Tensor, local_ids: Tensor, fp8: Fp8ExpertScales
) -> Tensor:
    """experts_reference with fp8 weights (w13 [E, 2I, k_padded], w2 [E, H, k_padded]): every slot's
    silu(gate) * up first, so that the down projection's straddling activation groups take their amax
    over the ranks in one exchange (`fp8.down_amax`), then the down projections in expert order."""
    top_k = local_ids.shape[1]
    ids = local_ids.reshape(-1)
    routed = [(e, slots) for e in range(w13.shape[0]) if (slots := torch.where(ids == e)[0]).numel()]
    act = x.new_zeros(ids.numel(), fp8.down.k_local)
    for expert, slots in routed:
        gate_up = w8a8_reference(x[slots // top_k], w13[expert], fp8.w13[expert], fp8.gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        act[slots] = F.silu(gate) * up
    amax = fp8.down_amax(act) if fp8.down_amax is not None else None
    out = torch.zeros_like(x)
    for expert, slots in routed:
        slot_amax = amax[slots] if amax is not None else None
        y = w8a8_reference(act[slots], w2[expert], fp8.w2[expert], fp8.down, None, slot_amax)
        out.index_add_(0, slots // top_k, (y * weights.reshape(-1)[slots, None]).to(out.dtype))
    return out
