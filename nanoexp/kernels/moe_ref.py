"""The MoE experts in torch: routing and the per-expert SwiGLU MLPs, computed as transformers'
Qwen3MoeForCausalLM computes them. The CPU path and the oracle of the Triton kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def route(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """(weights [T, top_k] in the logits' dtype, expert ids [T, top_k] int64): softmax over the experts in
    float32, torch.topk (its tie-breaking is transformers'), renormalized to sum 1 when `renormalize`."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def experts_reference(x: Tensor, w13: Tensor, w2: Tensor, weights: Tensor, local_ids: Tensor) -> Tensor:
    """sum_k weights[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) over this rank's experts e = ids[t, k]
    (ids outside [0, experts) belong to other ranks and add nothing). w13 [E, 2I, H] holds gate then up,
    w2 [E, H, I]. Experts are added in id order, each token's contribution once, as transformers does."""
    out = torch.zeros_like(x)
    for expert in range(w13.shape[0]):
        tokens, slots = torch.where(local_ids == expert)
        if tokens.numel() == 0:
            continue
        gate, up = F.linear(x[tokens], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert]) * weights[tokens, slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out
