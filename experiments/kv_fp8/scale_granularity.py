"""Does an fp8 KV cache lose less with one scale per kv head than with one per layer?

The engine calibrates one K and one V scale per layer (nanoexp/runner/kv_scales.py). This script
measures `kv_quality` (greedy agreement, KL against the model-dtype reference) on the trained tiny
checkpoint on CPU, first with the engine's per-layer scales, then with per-head scales taken
from the same calibration prefill: the torch reference backend broadcasts a [kv_heads, 1] scale
over its [..., kv_heads, head_dim] K/V, so only the scales change between the measurements.
Each granularity is also measured with its scales x 1.25 (`--jitter`): e4m3's precision is
relative, so that rounds every value differently at the same granularity; the gap between a row
and its jittered twin is the noise a granularity's difference must beat.

    python experiments/kv_fp8/scale_granularity.py [--num-tokens 32] [--jitter 1.25] [--out f.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from nanoexp import LLM
from nanoexp.experiment.runtime import atomic_files
from nanoexp.layers.attention import Attention, attention_layers
from nanoexp.runner.kv_scales import scale_for

CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"
KEYS = ("greedy_agreement", "kl_mean", "kl_p99", "kl_max", "num_positions")


def per_head_amax(llm: LLM) -> dict[Attention, list[torch.Tensor]]:
    """Each layer's largest |K| and |V| per kv head in the engine's own calibration prefill."""
    runner = llm.engine.executor.runner
    layers = attention_layers(runner.model)
    amax = {layer: [torch.zeros(layer.num_kv_heads), torch.zeros(layer.num_kv_heads)] for layer in layers}

    def record(layer: Attention, args: tuple) -> None:
        _, k, v, _ = args
        for seen, x in zip(amax[layer], (k, v), strict=True):
            heads = x.detach().float().abs().reshape(-1, layer.num_kv_heads, layer.head_dim)
            torch.maximum(seen, heads.amax(dim=(0, 2)).cpu(), out=seen)

    hooks = [layer.register_forward_pre_hook(record) for layer in layers]
    try:
        runner.calibrate_kv_scales()  # also resets the per-layer scales, which are not used after
    finally:
        for hook in hooks:
            hook.remove()
    return amax


def use_scales(amax: dict[Attention, list[torch.Tensor]], factor: float, per_head: bool) -> None:
    """The engine's scale rule (`scale_for`) times `factor`, from the per-head amax: one scale per
    kv head, or their largest for the whole layer."""
    for layer, (k_amax, v_amax) in amax.items():
        k_amax, v_amax = (k_amax, v_amax) if per_head else (k_amax.max(), v_amax.max())
        layer.k_scale = (scale_for(k_amax) * factor).view(-1, 1)
        layer.v_scale = (scale_for(v_amax) * factor).view(-1, 1)


def spread(amax: dict[Attention, list[torch.Tensor]]) -> str:
    """Largest over smallest head amax, per layer, K and V."""
    return ", ".join(
        f"L{i} K {float(k.max() / k.min()):.2f} V {float(v.max() / v.min()):.2f}"
        for i, (k, v) in enumerate(amax.values())
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-tokens", type=int, default=32)
    parser.add_argument("--jitter", type=float, default=1.25, help="the twin rows' factor on every scale")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in open(CHECKPOINT / "prompts.jsonl")]
    rows = []
    with LLM(
        str(CHECKPOINT),
        device="cpu",
        dtype="float32",
        kv_cache_dtype="fp8_e4m3",
        attention_backend="torch",
        kv_block_size=16,
    ) as llm:
        rows.append(("one per layer (the engine's)", llm.kv_cache_quality(prompts, args.num_tokens)))
        amax = per_head_amax(llm)
        for per_head, factor in ((False, args.jitter), (True, 1.0), (True, args.jitter)):
            use_scales(amax, factor, per_head)
            twin = f" x {factor:g}" if factor != 1 else ""
            name = ("one per kv head" if per_head else "one per layer") + twin
            rows.append((name, llm.kv_cache_quality(prompts, args.num_tokens)))
    lines = [
        f"kv-head amax spread (max / min head): {spread(amax)}",
        "",
        "| fp8 scales | " + " | ".join(KEYS) + " |",
        "|---|" + "---:|" * len(KEYS),
        *(f"| {name} | " + " | ".join(f"{q[key]:.4g}" for key in KEYS) + " |" for name, q in rows),
    ]
    print("\n".join(lines))
    if args.out:
        atomic_files.write_atomically(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
