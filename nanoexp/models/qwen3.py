"""Qwen3 (and Qwen2/Qwen2.5, which differ by q/k/v bias instead of per-head q/k norm): attention, the
dense MLP and the layer structure that Qwen3-MoE (models/qwen3_moe.py) shares."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from transformers import PretrainedConfig

from nanoexp.kernels.base import AttentionMetadata
from nanoexp.layers.activation import SiluAndMul
from nanoexp.layers.attention import Attention
from nanoexp.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from nanoexp.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from nanoexp.layers.norm import RMSNorm
from nanoexp.layers.rope import RotaryEmbedding, apply_rope, qk_norm_rope


class Qwen3Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int, qk_norm: bool):
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        bias = getattr(config, "attention_bias", not qk_norm)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, heads, kv_heads, bias)
        heads, kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads  # this rank's
        self.sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]  # of q, k and v in qkv
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size)
        # plain RoPE: other rope types are refused by loader.check_hf_config
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.rotary_emb = RotaryEmbedding(head_dim, max_position, theta)
        self.attn = Attention(heads, kv_heads, head_dim, head_dim**-0.5)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)

    def forward(self, positions: Tensor, qkv: Tensor, md: AttentionMetadata):
        """Attention output (after o_proj) of the fused q/k/v projection `qkv`."""
        norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else None
        out = self.attn.forward_qkv(qkv, positions, self.rotary_emb.cos_sin, norm, md)
        if out is None:  # the backend has no fused op: q and k normed and rotated here, then attention
            q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in qkv.split(self.sizes, dim=-1))
            if norm is None:
                q, k = apply_rope(positions, q, k, self.rotary_emb.cos_sin)
            else:
                q, k = qk_norm_rope(positions, q, k, *norm, self.rotary_emb.cos_sin)
            out = self.attn(q, k, v, md)
        return self.o_proj(out.flatten(1))


class Qwen3MLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter])
        self.down_proj = RowParallelLinear(inter, config.hidden_size)
        self.act_fn = SiluAndMul()

    def forward(
        self, hidden: Tensor, residual: Tensor, norm: RMSNorm, md: AttentionMetadata | None = None
    ) -> tuple[Tensor, Tensor]:
        """(down(SwiGLU(gate_up(norm(hidden + residual)))), hidden + residual)."""
        act, residual = self.gate_up_proj.norm_gated_linear(
            norm, hidden, residual, self.act_fn, self.down_proj
        )
        return self.down_proj(act), residual


MlpFactory = Callable[[PretrainedConfig, int], nn.Module]  # (config, layer index) -> the layer's MLP


def dense_mlp(config: PretrainedConfig, layer: int) -> nn.Module:
    return Qwen3MLP(config)


class Qwen3DecoderLayer(nn.Module):
    """Attention then an MLP, each after an RMSNorm; the MLP (dense, or a MoE block) takes
    (hidden, residual, norm, md) and returns (its output, hidden + residual)."""

    def __init__(self, config: PretrainedConfig, max_position: int, qk_norm: bool, mlp: nn.Module):
        super().__init__()
        self.self_attn = Qwen3Attention(config, max_position, qk_norm)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, residual, md: AttentionMetadata):
        qkv, residual = self.self_attn.qkv_proj.norm_linear(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(positions, qkv, md)
        return self.mlp(hidden, residual, self.post_attention_layernorm, md)


class Qwen3Model(nn.Module):
    def __init__(
        self, config: PretrainedConfig, max_position: int, qk_norm: bool, mlp: MlpFactory = dense_mlp
    ):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        layers = (
            Qwen3DecoderLayer(config, max_position, qk_norm, mlp(config, i))
            for i in range(config.num_hidden_layers)
        )
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, positions, md: AttentionMetadata) -> Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, md)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3ForCausalLM(nn.Module):
    """Qwen3 dense; subclasses change the attention's q/k norm (Qwen2) or the MLPs (`make_mlp`: MoE)."""

    qk_norm = True
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: PretrainedConfig, max_position: int, expert_parallel: bool = False):
        super().__init__()
        self.expert_parallel = expert_parallel
        self.model = Qwen3Model(config, max_position, self.qk_norm, self.make_mlp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_mlp(self, config: PretrainedConfig, layer: int) -> nn.Module:
        return dense_mlp(config, layer)

    def forward(self, input_ids, positions, md: AttentionMetadata) -> Tensor:
        return self.model(input_ids, positions, md)

    def compute_logits(self, hidden: Tensor) -> Tensor | None:
        return self.lm_head(hidden)

    def compute_local_logits(self, hidden: Tensor) -> tuple[Tensor, int]:
        """This rank's vocabulary shard of the logits, and the token id of its column 0."""
        return self.lm_head.local_logits(hidden), self.lm_head.vocab_start


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    qk_norm = False
