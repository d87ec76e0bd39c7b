"""Per-layer scales of an fp8 KV cache, calibrated once at start-up: one eager prefill of a fixed
pseudo-random token sequence (nothing stored) records the largest |K| and |V| (after q/k norm and RoPE)
each attention layer receives; its scale, amax / 448 x HEADROOM, is written in place into
`Attention.k_scale`/`v_scale` (CUDA graphs hold their addresses). Under TP each rank calibrates its heads."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from nanoexp.kernels.base import FP8_MAX
from nanoexp.layers.attention import Attention, attention_layers

CALIBRATION_TOKENS = 512
CALIBRATION_SEED = 0
# e4m3 precision is relative, so a scale twice the calibrated amax costs almost nothing, and real
# prompts whose K/V exceed the calibration prompt's still fit before saturating at +-448.
HEADROOM = 2.0
MIN_AMAX = 1e-6  # a layer whose K or V were all zero still gets a usable, normal scale


def calibration_tokens(vocab_size: int, max_tokens: int) -> list[int]:
    """The fixed token sequence of the calibration prefill (the same on every rank and run)."""
    gen = torch.Generator().manual_seed(CALIBRATION_SEED)
    count = min(CALIBRATION_TOKENS, max_tokens)
    return torch.randint(vocab_size, (count,), generator=gen).tolist()


def calibrate_kv_scales(model: nn.Module, run_prefill: Callable[[], None]) -> None:
    """Sets every attention layer's k_scale/v_scale from the K/V amax seen during `run_prefill`."""
    layers = attention_layers(model)
    amax = {layer: [torch.zeros(1, device=layer.k_scale.device) for _ in range(2)] for layer in layers}

    def record(layer: Attention, args: tuple) -> None:
        _, k, v, _ = args
        for seen, x in zip(amax[layer], (k, v), strict=True):
            torch.maximum(seen, x.detach().abs().amax().float(), out=seen)

    with contextlib.ExitStack() as hooks:  # each removed on the way out
        for layer in layers:
            hooks.enter_context(layer.register_forward_pre_hook(record))
        run_prefill()
    for layer, (k_amax, v_amax) in amax.items():
        layer.k_scale.copy_(scale_for(k_amax))
        layer.v_scale.copy_(scale_for(v_amax))


def scale_for(amax: torch.Tensor) -> torch.Tensor:
    return amax.clamp(min=MIN_AMAX) / FP8_MAX * HEADROOM


def scales_summary(model: nn.Module) -> dict[str, float]:
    """Mean and max of the per-layer K and V scales (1.0 for a cache in the model's dtype)."""
    layers = attention_layers(model)
    summary: dict[str, float] = {}
    for name in ("k_scale", "v_scale"):
        values = torch.cat([getattr(layer, name).float().cpu() for layer in layers])
        summary |= {f"kv_{name}_mean": float(values.mean()), f"kv_{name}_max": float(values.max())}
    return summary
