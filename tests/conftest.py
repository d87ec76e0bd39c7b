"""Tiny random Qwen3/Qwen2 checkpoints written with transformers, and their reference outputs."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run in the CPU interpreter; transformers imports triton below, and the
    # language's own jit helpers (tl.zeros, tl.rand) are decorated at that import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

SHAPES = {
    # name: (architecture, heads, kv heads, head_dim, hidden, tied)
    "qwen3_gqa1": ("qwen3", 4, 4, 16, 64, False),
    "qwen3_gqa2_tied": ("qwen3", 4, 2, 32, 64, True),  # head_dim != hidden / heads
    "qwen3_gqa4": ("qwen3", 8, 2, 16, 96, False),
    "qwen2_gqa2": ("qwen2", 4, 2, 16, 64, True),
}


def build_checkpoint(
    path,
    arch: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden: int,
    tied: bool,
    vocab: int = 384,
    layers: int = 2,
    seed: int = 0,
):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
        eos_token_id=vocab - 1,
        bos_token_id=vocab - 2,
    )
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=head_dim, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model = model.float().eval()
    with torch.no_grad():  # random init of norms is 1; perturb so the norms are exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, transformers model)."""
    out = {}
    for name, shape in SHAPES.items():
        path = tmp_path_factory.mktemp(name)
        out[name] = (str(path), build_checkpoint(path, *shape))
    return out


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy tokens as with `ignore_eos`: EOS may be generated but does not stop
    generation (`min_new_tokens` would instead forbid EOS, a different sequence when it wins)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def random_prompts(lengths, vocab: int = 380, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="session")
def reference_outputs(checkpoints):
    """Cache of transformers greedy outputs keyed by (checkpoint, prompt, length)."""
    cache = {}

    def get(name: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (name, tuple(prompt), max_new_tokens)
        if key not in cache:
            cache[key] = hf_greedy(checkpoints[name][1], prompt, max_new_tokens)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def moe_checkpoints(tmp_path_factory):
    """MoE name (tests/moe_checkpoints.py) -> (directory, transformers model), built on first use."""
    from tests.moe_checkpoints import MoeCheckpoints

    return MoeCheckpoints(tmp_path_factory)


@pytest.fixture(autouse=True)
def release_gpu_memory(request):
    """After a GPU test, frees what it left unreferenced, so the next test's engine sizes its KV
    cache from memory that is really free (a failed test's traceback can keep an engine alive)."""
    yield
    if torch.cuda.is_available() and request.node.get_closest_marker("gpu"):
        import gc

        gc.collect()
        torch.cuda.empty_cache()
