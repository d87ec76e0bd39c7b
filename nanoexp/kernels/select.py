"""Pick the attention backend for a device and KV block size."""

from __future__ import annotations

import importlib.util
import os

import torch

from nanoexp.kernels.base import AttentionBackend
from nanoexp.kernels.flash_attn_backend import (
    FlashAttnBackend,
    check_block_size,
    flash_attn_available,
)
from nanoexp.kernels.torch_ref import TorchAttentionBackend

BACKEND_NAMES = ("auto", "torch", "triton", "flash_attn")


def make_attention_backend(name: str, device: torch.device, block_size: int) -> AttentionBackend:
    """Build backend `name`; "auto" prefers flash_attn, then triton on CUDA, torch on CPU."""
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    if name == "auto":
        if on_cuda and block_size % 256 == 0 and flash_attn_available():
            return FlashAttnBackend(block_size)
        if on_cuda and triton_available():
            return _triton_backend()
        return TorchAttentionBackend()
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        if not triton_available():
            raise ValueError("attention_backend='triton' needs the triton package; use 'torch'")
        if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"attention_backend='triton' needs a CUDA device, got {device}; on CPU use "
                "attention_backend='torch' or 'auto' (or set TRITON_INTERPRET=1 to run the "
                "kernels in the slow Triton interpreter)"
            )
        return _triton_backend()
    if name == "flash_attn":
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
    allowed = ", ".join(BACKEND_NAMES)
    raise ValueError(f"attention_backend={name!r} is invalid: must be one of {allowed}")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_backend() -> AttentionBackend:
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()
