"""Tiny checkpoints and engine settings shared by the tensor-parallel tests, and child-process checks."""

from __future__ import annotations

import multiprocessing as mp
import os

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from nanoexp.config import SamplingParams

BLOCK = 4
ENGINE = dict(
    device="cpu",
    dtype="float32",
    kv_block_size=BLOCK,
    num_kv_blocks=14,
    max_num_seqs=4,
    max_num_batched_tokens=64,
    enable_prefix_caching=True,
)
PREFIX = [5, 17, 42, 8, 99, 23, 61, 7, 13, 77, 31, 2]  # three full blocks shared by every prompt
PROMPTS = [PREFIX + [i + 1, 2 * i + 3, 50 - i] for i in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)

MODELS = {
    # name: (config class, model class, vocab, kv heads, tied embeddings)
    "qwen3_kv4": (Qwen3Config, Qwen3ForCausalLM, 128, 4, False),
    "qwen3_kv2_pad": (Qwen3Config, Qwen3ForCausalLM, 131, 2, False),  # KV replicated at TP=4
    "qwen2_bias": (Qwen2Config, Qwen2ForCausalLM, 131, 2, True),
}


def build_checkpoint(path, name: str) -> str:
    config_cls, model_cls, vocab, kv_heads, tied = MODELS[name]
    head_dim = {} if config_cls is Qwen2Config else {"head_dim": 16}  # Qwen2: hidden / heads = 8
    config = config_cls(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        initializer_range=0.1,
        **head_dim,
    )
    torch.manual_seed(sum(map(ord, name)))
    model = model_cls(config)
    if name == "qwen2_bias":
        with torch.no_grad():  # HF zero-initializes biases; make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return str(path)


def child_pids() -> list[int]:
    """Live (or unreaped) child processes of this process, read from /proc; multiprocessing's
    resource tracker and torch.compile's worker pool (shared by the interpreter, gone when it
    exits) do not count."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if is_worker_child(pid)]


def is_worker_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, IndexError, ValueError):
        return False
    helpers = (b"resource_tracker", b"_inductor")  # interpreter-wide helpers, not engine workers
    return ppid == os.getpid() and not any(h in cmdline for h in helpers)


def assert_no_workers() -> None:
    assert mp.active_children() == []
    assert child_pids() == []


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
