"""Tiny random Qwen3-MoE checkpoints written with transformers' Qwen3MoeForCausalLM."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

MOE_SHAPES = {
    # name: config fields beyond the common ones
    "moe_e8_top2": dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "moe_e16_top4_unnormed": dict(
        num_experts=16, num_experts_per_tok=4, norm_topk_prob=False, num_attention_heads=8
    ),
    # MoE in layer 1 only: sparse every 2nd layer (1, 3), and layer 3 kept dense
    "moe_sparse_step2": dict(
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
        mlp_only_layers=[3], num_hidden_layers=4,
    ),
}  # fmt: skip


def moe_config(name: str, vocab: int = 384, **changes) -> Qwen3MoeConfig:
    """The shape `name` (with `changes` to any config field)."""
    fields = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        eos_token_id=vocab - 1,
        bos_token_id=vocab - 2,
        architectures=["Qwen3MoeForCausalLM"],
    )
    return Qwen3MoeConfig(**{**fields, **MOE_SHAPES[name], **changes})


def build_moe_checkpoint(
    path, name: str, seed: int = 0, dtype: torch.dtype = torch.float32, **changes
) -> Qwen3MoeForCausalLM:
    """Saved to `path` in `dtype` (its config.json says num_local_experts, as transformers 5 writes it;
    Qwen's own checkpoints say num_experts); returns the transformers model. The routers are scaled up so
    top-k picks are decisive (the gap to the next expert far above float32 rounding), the norms perturbed.
    `changes`: config fields that differ from the shape `name`'s."""
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(moe_config(name, **changes)).to(dtype).eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if "norm" in param_name:
                p.add_(torch.randn_like(p) * 0.1)
            elif param_name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
    model.save_pretrained(path)
    return model


class MoeCheckpoints:
    """Each shape's checkpoint built on first use; transformers' greedy tokens cached per prompt."""

    def __init__(self, tmp_path_factory):
        self.tmp, self.built, self.greedy = tmp_path_factory, {}, {}

    def __getitem__(self, name: str) -> tuple[str, Qwen3MoeForCausalLM]:
        if name not in self.built:
            path = self.tmp.mktemp(name)
            self.built[name] = (str(path), build_moe_checkpoint(path, name))
        return self.built[name]

    def reference(self, name: str, prompt: list[int], max_tokens: int) -> list[int]:
        from checkpoints import hf_greedy

        key = (name, tuple(prompt), max_tokens)
        if key not in self.greedy:
            self.greedy[key] = hf_greedy(self[name][1], prompt, max_tokens)
        return self.greedy[key]


def recording_decode_calls(monkeypatch) -> list[int]:
    """The engine binds the Triton MoE path; each MoE decode-path call's token count is recorded (with the
    routing folded into it or after the routing kernel)."""
    from nanoexp.kernels import triton_moe
    from nanoexp.runner import model_setup

    calls: list[int] = []
    for name in ("route_decode_moe", "decode_moe"):
        kernel = getattr(triton_moe, name)

        def spy(x, *args, kernel=kernel, **kwargs):
            calls.append(x.shape[0])
            return kernel(x, *args, **kwargs)

        monkeypatch.setattr(triton_moe, name, spy)
    monkeypatch.setattr(model_setup, "make_moe_kernel", triton_moe.make_triton_moe)
    return calls
