"""The floor of the steps a Qwen3-30B-A3B job actually ran, from its steps.csv and requests.csv:

    python experiments/moe/bench_floor.py <job dir> [--fp8]

Each decode step of n sequences reads the attention weights, the routers, the LM head and the experts its
tokens touch (128 x (1 - (120/128)^n) a layer on average), at BANDWIDTH; each request's decode steps read
its whole context's KV; prefill steps are FLOPs at PEAK_FLOPS (2 x the active parameters a token, plus
causal attention). H100 numbers (DESIGN.md). --fp8: a job with `model.quantization=fp8`, whose attention
projections and experts are one byte a weight (their block scales, 1/16,384 of that, left out) and whose
prefill GEMMs run at the fp8 rate; the routers, the LM head, the KV cache and attention's FLOPs as in bf16."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

BANDWIDTH, PEAK_FLOPS = 3.0e12, 989e12
LAYERS, HIDDEN, EXPERTS, TOP_K, EXPERT_INTER, VOCAB = 48, 2048, 128, 8, 768, 151936
Q_DIM, KV_DIM, HEADS, HEAD_DIM, KV_HEADS = 4096, 512, 32, 128, 4
ATTENTION_PARAMS = 2 * Q_DIM * HIDDEN + 2 * KV_DIM * HIDDEN
EXPERT_PARAMS = 3 * EXPERT_INTER * HIDDEN
ROUTER_BYTES = EXPERTS * HIDDEN * 2
HEAD_BYTES = VOCAB * HIDDEN * 2
KV_BYTES_PER_TOKEN = LAYERS * KV_HEADS * HEAD_DIM * 2 * 2
ACTIVE_PARAMS = LAYERS * (ATTENTION_PARAMS + TOP_K * EXPERT_PARAMS + EXPERTS * HIDDEN)


def decode_weight_bytes(seqs: int, weight_bytes: int = 2) -> float:
    """What a decode step of `seqs` sequences reads of the weights, `weight_bytes` a quantized weight."""
    touched = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** seqs)
    quantized = touched * EXPERT_PARAMS + ATTENTION_PARAMS
    return LAYERS * (quantized * weight_bytes + ROUTER_BYTES) + HEAD_BYTES


def kv_bytes(prompt: int, output: int) -> float:
    """The KV a request's decode steps read: its context at each of its output_len - 1 decode steps."""
    steps = output - 1
    return (steps * prompt + steps * output / 2) * KV_BYTES_PER_TOKEN


def main(job: Path, fp8: bool = False) -> None:
    steps = list(csv.DictReader(open(job / "steps.csv")))
    requests = list(csv.DictReader(open(job / "requests.csv")))
    decode = [s for s in steps if s["phase"] == "decode"]
    prefill = [s for s in steps if s["phase"] != "decode"]
    weights = sum(decode_weight_bytes(int(s["num_seqs"]), 1 if fp8 else 2) for s in decode)
    kv = sum(kv_bytes(int(r["prompt_len"]), int(r["output_len"])) for r in requests)
    attention_flops = sum(LAYERS * 4 * HEADS * HEAD_DIM * int(r["prompt_len"]) ** 2 / 2 for r in requests)
    linear_flops = sum(2 * int(s["num_prefill_tokens"]) * ACTIVE_PARAMS for s in prefill)
    decode_s = sum(float(s["step_time_ms"]) for s in decode) / 1e3
    prefill_s = sum(float(s["step_time_ms"]) for s in prefill) / 1e3
    decode_floor = (weights + kv) / BANDWIDTH
    prefill_floor = (linear_flops / (2 if fp8 else 1) + attention_flops) / PEAK_FLOPS
    output = sum(int(r["output_len"]) for r in requests)
    print(f"{job}: {len(requests)} requests, {output} output tokens, {len(decode)} decode steps")
    print(
        f"  decode {decode_s:.2f} s against {decode_floor:.2f} s ({decode_s / decode_floor:.2f}x; "
        f"weights {weights / 1e9:.0f} GB, KV {kv / 1e9:.1f} GB read)"
    )
    print(
        f"  prefill {prefill_s:.3f} s against {prefill_floor:.3f} s of FLOPs "
        f"({prefill_s / prefill_floor:.1f}x)"
    )
    total, floor = decode_s + prefill_s, decode_floor + prefill_floor
    print(
        f"  all steps {total:.2f} s against {floor:.2f} s ({total / floor:.2f}x); "
        f"output tok/s at the floor {output / floor:.0f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path, help="a job directory holding steps.csv and requests.csv")
    parser.add_argument("--fp8", action="store_true", help="the job ran with model.quantization=fp8")
    args = parser.parse_args()
    main(args.job, args.fp8)
