"""Greedy parity of TP=N against TP=1 on the same random-weight checkpoint.

Dummy weights are drawn per rank (each rank seeds its own shard), so a TP=N dummy model is a
different model from TP=1. This script saves one random Hugging Face checkpoint of the model's
architecture and loads it through the real (sharding) loader for every TP size instead.

Policy (bf16): sequences need not be identical, since a different reduction order can flip a
near-tie; at the first divergence the TP=N token must be among TP=1's top-3 tokens.

    python experiments/tp_scaling/parity.py --tp 2 4 8 [--model qwen3_0_6b] [--out parity.json]
    python experiments/tp_scaling/parity.py --model qwen3_tiny --device cpu --dtype float32 --tp 2
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
import yaml

from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM
from nanoexp.experiment.runtime import atomic_files
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import StepInput

BLOCK = 256
TOP_K = 3


def save_checkpoint(model: str, dtype: str, path: Path, seed: int = 0) -> None:
    """A random Hugging Face checkpoint with the architecture of conf/model/<model>.yaml."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = yaml.safe_load(Path(f"conf/model/{model}.yaml").read_text())["arch"]
    fields = {k: v for k, v in arch.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(seed)
    hf = Qwen3ForCausalLM(Qwen3Config(**fields)).to(getattr(torch, dtype))
    hf.save_pretrained(path)


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(16, 128))] for _ in range(n)]


def engine_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        device=args.device,
        dtype=args.dtype,
        kv_block_size=BLOCK,
        max_model_len=1024,
        max_num_seqs=64,
        gpu_memory_utilization=0.5,
        cpu_kv_cache_gib=0.5,
    )


def generate(ckpt: str, tp: int, prompts: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    with LLM(ckpt, tensor_parallel_size=tp, **engine_kwargs(args)) as llm:
        return [list(o.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def top_k_at(llm: LLM, tokens: list[int]) -> list[int]:
    """TP=1's top-k next tokens after `tokens` (a one-sequence prefill into blocks 0..)."""
    n = len(tokens)
    step = StepInput(True, tokens, [n], [n], [list(range(-(-n // BLOCK)))], [])
    runner = llm.engine.executor.runner
    inputs = prepare_inputs(step, BLOCK, runner.device)
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, inputs.md)
        logits = runner.model.compute_logits(hidden)
    return logits[-1].float().topk(TOP_K).indices.tolist()


def compare(
    ckpt: str, prompts: list[list[int]], ref: list[list[int]], got: list[list[int]], args: argparse.Namespace
) -> dict:
    """Counts identical sequences; checks each first divergence against TP=1's top-k."""
    diverged = [(i, k) for i in range(len(prompts)) if (k := first_divergence(ref[i], got[i])) is not None]
    in_top = 0
    if diverged:
        with LLM(ckpt, tensor_parallel_size=1, **engine_kwargs(args)) as llm:
            in_top = sum(got[i][k] in top_k_at(llm, prompts[i] + ref[i][:k]) for i, k in diverged)
    n = len(prompts)
    return {
        "sequences": n,
        "identical": n - len(diverged),
        "identical_fraction": (n - len(diverged)) / n,
        "first_divergence_in_top3": in_top,
        "mean_first_divergence": sum(k for _, k in diverged) / len(diverged) if diverged else None,
        "passed": in_top == len(diverged),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3_0_6b", help="a conf/model/*.yaml name")
    parser.add_argument("--tp", type=int, nargs="+", default=[2])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nanoexp-parity-") as ckpt:
        save_checkpoint(args.model, args.dtype, Path(ckpt))
        vocab = yaml.safe_load(Path(f"conf/model/{args.model}.yaml").read_text())["arch"]["vocab_size"]
        prompts = make_prompts(args.num_prompts, vocab)
        ref = generate(ckpt, 1, prompts, args)
        results = {
            f"tp{tp}": compare(ckpt, prompts, ref, generate(ckpt, tp, prompts, args), args) for tp in args.tp
        }
    report = {"model": args.model, "dtype": args.dtype, "max_tokens": args.max_tokens, "results": results}
    print(json.dumps(report, indent=2))
    if args.out:
        atomic_files.write_atomically(args.out, json.dumps(report, indent=2) + "\n")
    raise SystemExit(0 if all(r["passed"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
