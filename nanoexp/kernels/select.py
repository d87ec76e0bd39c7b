"""Pick the attention backend for a device, KV block size, dtype, head size and KV-cache dtype.

`auto` never chooses blindly: a candidate other than the torch reference is taken only after it
passes a one-time self-check against the reference (nanoexp/kernels/self_check.py); a candidate
that fails is skipped with one warning line. An explicitly requested backend is built as asked.
Every backend returned carries `selection`, a one-line note of why it was chosen.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from nanoexp.kernels.base import AttentionBackend
from nanoexp.kernels.flash_attn_backend import (
    FLASH_ATTN_PAGE_MULTIPLE,
    FlashAttnBackend,
    check_block_size,
    check_no_fp8_cache,
    flash_attn_available,
)
from nanoexp.kernels.self_check import check_backend, describe
from nanoexp.kernels.torch_ref import TorchAttentionBackend

log = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "torch", "triton", "flash_attn")

# The order in which `auto` tries backends on CUDA before falling back to torch: on an H200 the
# nano-vLLM benchmark runs 5-7% faster with triton than with flash-attn 2 (experiments/kernels/).
AUTO_CUDA_ORDER = ("triton", "flash_attn")


def make_attention_backend(
    name: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype | None = None,
    head_dim: int = 128,
    kv_cache_dtype: str = "auto",
) -> AttentionBackend:
    """Build backend `name`; "auto" takes the first self-checked backend of `auto_candidates`, else
    torch. `dtype` and `head_dim` describe the model's attention (the self-check runs in them);
    dtype defaults to bfloat16 on CUDA and float32 on CPU. `kv_cache_dtype` is the cache knob
    (auto or an fp8 name): flash_attn has no fp8 cache, so auto skips it and asking for it fails."""
    device = torch.device(device)
    kv_fp8 = kv_cache_dtype != "auto"
    if name == "auto":
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        return choose_auto(device, block_size, dtype, head_dim, kv_fp8)
    if name not in BACKEND_NAMES:
        allowed = ", ".join(BACKEND_NAMES)
        raise ValueError(f"attention_backend={name!r} is invalid: must be one of {allowed}")
    if name == "flash_attn":
        check_no_fp8_cache(kv_cache_dtype)
    backend = _build_requested(name, device, block_size)
    backend.selection = f"{name}: requested explicitly (not self-checked)"
    return backend


Builder = Callable[[], AttentionBackend]


def auto_candidates(
    device: torch.device, block_size: int, dtype: torch.dtype, kv_fp8: bool = False
) -> list[tuple[str, Builder]]:
    """(name, builder) of the backends `auto` may use here, in order of preference, before torch."""
    if device.type != "cuda":
        return []
    usable = {
        "triton": triton_available(),
        "flash_attn": (
            not kv_fp8
            and block_size % FLASH_ATTN_PAGE_MULTIPLE == 0
            and dtype in (torch.float16, torch.bfloat16)
            and flash_attn_available()
        ),
    }
    builders = {"triton": _triton_backend, "flash_attn": lambda: FlashAttnBackend(block_size)}
    return [(name, builders[name]) for name in AUTO_CUDA_ORDER if usable[name]]


def choose_auto(
    device: torch.device, block_size: int, dtype: torch.dtype, head_dim: int, kv_fp8: bool = False
) -> AttentionBackend:
    rejected = []
    for name, build in auto_candidates(device, block_size, dtype, kv_fp8):
        try:
            backend = build()
            result = check_backend(backend, device, dtype, head_dim, block_size, kv_fp8)
            ok, reason = result.ok, result.reason
        except Exception as exc:  # a backend that cannot even be built is rejected like a wrong one
            ok, reason = False, describe(exc)
        if ok:
            backend.selection = _note(f"{name}: passed self-check ({reason})", rejected)
            return backend
        log.warning(
            "attention_backend=auto: not using %s, its self-check against the torch reference failed "
            "(%s%s, head_dim=%d, block_size=%d): %s", name, str(dtype).removeprefix("torch."),
            ", fp8 KV cache" if kv_fp8 else "", head_dim, block_size, reason,
        )  # fmt: skip
        rejected.append(f"{name} rejected ({reason})")
    backend = TorchAttentionBackend()
    backend.selection = _note("torch: reference", rejected)
    return backend


def _note(chosen: str, rejected: list[str]) -> str:
    return "auto: " + "; ".join([*rejected, chosen])


def _build_requested(name: str, device: torch.device, block_size: int) -> AttentionBackend:
    on_cuda = device.type == "cuda"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        if not triton_available():
            raise ValueError("attention_backend='triton' needs the triton package; use 'torch'")
        if not triton_runs_on(device):
            raise ValueError(
                f"attention_backend='triton' needs a CUDA device, got {device}; on CPU use "
                "attention_backend='torch' or 'auto' (or set TRITON_INTERPRET=1 to run the "
                "kernels in the slow Triton interpreter)"
            )
        return _triton_backend()
    if not on_cuda:
        raise ValueError(
            f"attention_backend='flash_attn' needs a CUDA device, got {device}; on CPU use "
            "attention_backend='torch' or 'auto'"
        )
    if not flash_attn_available():
        raise ValueError(
            "attention_backend='flash_attn' needs the flash_attn package; use 'triton' or 'auto'"
        )
    check_block_size(block_size)
    return FlashAttnBackend(block_size)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_half_precision(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the Triton fast paths that `auto` picks run: CUDA, bf16/fp16, Triton installed
    (float32 keeps torch's ops, the parity reference)."""
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and triton_available()


def triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on CUDA, or on the CPU in the (slow) interpreter when it is switched on."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _triton_backend() -> AttentionBackend:
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()
