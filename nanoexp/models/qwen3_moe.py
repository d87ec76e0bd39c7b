"""Qwen3-MoE: Qwen3's attention and layers, with sparse MoE blocks in place of the dense MLP where
`decoder_sparse_step` and `mlp_only_layers` put them (as transformers' Qwen3MoeForCausalLM)."""

from __future__ import annotations

import re

from torch import Tensor, nn
from transformers import PretrainedConfig

from nanoexp.distributed import all_reduce
from nanoexp.kernels.base import AttentionMetadata
from nanoexp.layers.fused_moe import FusedMoE
from nanoexp.layers.linear import ReplicatedLinear
from nanoexp.layers.norm import RMSNorm
from nanoexp.models.qwen3 import Qwen3ForCausalLM, dense_mlp

EXPERT_TENSOR = re.compile(r"\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight(_scale_inv)?$")


def is_sparse_layer(config: PretrainedConfig, layer: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    return layer not in only_mlp and config.num_experts > 0 and (layer + 1) % step == 0


class Qwen3MoeSparseBlock(nn.Module):
    """A replicated router (hidden -> experts) and the experts; the partial outputs all-reduced once."""

    def __init__(self, config: PretrainedConfig, expert_parallel: bool):
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts)
        self.experts = FusedMoE(
            config.num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            bool(getattr(config, "norm_topk_prob", False)),
            expert_parallel,
        )

    def forward(
        self, hidden: Tensor, residual: Tensor, norm: RMSNorm, md: AttentionMetadata | None = None
    ) -> tuple[Tensor, Tensor]:
        normed, residual = norm(hidden, residual)
        counting = md is not None and self.experts.load_counts is not None
        token_slots = md.slot_mapping if counting and md is not None else None
        return all_reduce(self.experts(normed, self.gate(normed), token_slots)), residual


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        if is_sparse_layer(config, layer):
            return Qwen3MoeSparseBlock(config, self.expert_parallel)
        return dense_mlp(config, layer)

    @staticmethod
    def checkpoint_target(name: str) -> tuple[str, tuple] | None:
        """An expert's gate/up/down tensor (or an fp8 one's block scales) -> (the fused parameter, (expert,
        shard)); None for the others."""
        match = EXPERT_TENSOR.search(name)
        if match is None:
            return None
        expert, shard, scales = int(match.group(1)), match.group(2), match.group(3) or ""
        param = ("w2" if shard == "down" else "w13") + scales
        return f"{name[: match.start()]}.mlp.experts.{param}", (expert, shard)
