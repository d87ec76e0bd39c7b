"""Which kernels run: the attention backend (by device, KV block size, dtype, head size and KV-cache
dtype) and the GEMM of decode-sized linear layers (torch's cuBLAS or the Triton skinny GEMM).

`auto` takes a non-reference attention backend only once it passes a one-time self-check against the
torch reference (kernels/self_check.py), else warns and skips it; an explicit request is built as asked.
Every backend returned carries `selection`, a one-line note of why it was chosen."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from nanoexp.config.checks import KnobError
from nanoexp.kernels.base import AttentionBackend
from nanoexp.kernels.flash_attn_backend import (
    FLASH_ATTN_PAGE_MULTIPLE,
    FlashAttnBackend,
    flash_attn_available,
)
from nanoexp.kernels.fp8_reference import Fp8Gemm, Fp8InputKernels
from nanoexp.kernels.self_check import check_backend, describe
from nanoexp.kernels.torch_ref import TorchAttentionBackend

log = logging.getLogger(__name__)

# The order in which `auto` tries backends on CUDA before falling back to torch: on an H200 the
# nano-vLLM benchmark runs 5-7% faster with triton than with flash-attn 2 (experiments/kernels/).
AUTO_CUDA_ORDER = ("triton", "flash_attn")

# Where `auto` takes the Triton GEMM (H200, bf16, vs cuBLAS): all of Qwen3-0.6B's layers; cuBLAS wins
# every Qwen3-8B shape but one tie (8B batch-1 TPOT 5.51 ms with the kernel, 4.95 without;
# experiments/kernels/runs/skinny_gemm_8b.md).
AUTO_MAX_ROWS = 16
AUTO_MAX_WEIGHT_BYTES = 12 * 2**20
# ... and one row of any layer of at most this many outputs, whatever its size (cuBLAS splits its K over two
# launches). H100, one row: Qwen3-30B-A3B's o_proj (2048 x 4096) 10.6 us on cuBLAS, 9.1 on the GEMV;
# Qwen3-1.7B's down (2048 x 6144) 13.6 / 13.3; at 16 rows cuBLAS wins (10.3 / 10.6, 13.4 / 13.8). Batch-1
# TPOT, one call: 30B-A3B 3.749 -> 3.628 ms, 1.7B 2.015 -> 1.980 ms (experiments/moe/README.md, run 7).
AUTO_MAX_NARROW_N = 2048
AUTO_MAX_NARROW_ROWS = 1
MAX_ROWS = 256  # the kernel's limit (triton_gemm.MAX_ROWS); `triton` takes every size up to it


def make_attention_backend(
    name: str,
    device: torch.device,
    block_size: int,
    dtype: torch.dtype | None = None,
    head_dim: int = 128,
    kv_cache_dtype: str = "auto",
) -> AttentionBackend:
    """Build backend `name`; "auto": the first self-checked of `auto_candidates`, else torch. `dtype`
    and `head_dim` are the model's (the self-check runs in them; dtype default: bf16 on CUDA, else fp32)."""
    device = torch.device(device)
    if name == "auto":
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        return choose_auto(device, block_size, dtype, head_dim, kv_cache_dtype != "auto")
    if name == "triton":
        require_triton("engine.attention_backend", device)
        backend = _triton_backend()
    elif name == "flash_attn":
        backend = FlashAttnBackend(block_size, kv_cache_dtype, device)
    else:  # torch (ExecutionConfig allows no other name)
        backend = TorchAttentionBackend()
    backend.selection = f"{name}: requested explicitly (not self-checked)"
    return backend


def auto_candidates(
    device: torch.device, block_size: int, dtype: torch.dtype, kv_fp8: bool = False
) -> list[tuple[str, Callable[[], AttentionBackend]]]:
    """(name, builder) of the backends `auto` may use here, in order of preference, before torch."""
    if device.type != "cuda":
        return []
    flash = (
        not kv_fp8 and block_size % FLASH_ATTN_PAGE_MULTIPLE == 0 and dtype in (torch.float16, torch.bfloat16)
    )
    usable = {"triton": triton_available(), "flash_attn": flash and flash_attn_available()}
    builders = {"triton": _triton_backend, "flash_attn": lambda: FlashAttnBackend(block_size)}
    return [(name, builders[name]) for name in AUTO_CUDA_ORDER if usable[name]]


def choose_auto(
    device: torch.device, block_size: int, dtype: torch.dtype, head_dim: int, kv_fp8: bool = False
) -> AttentionBackend:
    rejected: list[str] = []
    for name, build in auto_candidates(device, block_size, dtype, kv_fp8):
        try:
            backend = build()
            ok, reason = check_backend(backend, device, dtype, head_dim, block_size, kv_fp8)
        except Exception as exc:  # a backend that cannot even be built is rejected like a wrong one
            ok, reason = False, describe(exc)
        if ok:
            backend.selection = "auto: " + "; ".join([*rejected, f"{name}: passed self-check ({reason})"])
            return backend
        log.warning(
            "attention_backend=auto: not using %s, its self-check against the torch reference failed "
            "(%s%s, head_dim=%d, block_size=%d): %s",
            name,
            str(dtype).removeprefix("torch."),
            ", fp8 KV cache" if kv_fp8 else "",
            head_dim,
            block_size,
            reason,
        )
        rejected.append(f"{name} rejected ({reason})")
    backend = TorchAttentionBackend()
    backend.selection = "auto: " + "; ".join([*rejected, "torch: reference"])
    return backend


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_half_precision(device: torch.device, dtype: torch.dtype) -> bool:
    """Where `auto` picks the Triton fast paths (float32 keeps torch's ops, the parity reference)."""
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and triton_available()


def require_triton(knob: str, device: torch.device) -> None:
    """`knob`='triton' needs Triton, and CUDA or the (slow) CPU interpreter switched on: a config error
    naming the knob (`engine.attention_backend`, `engine.gemm_backend`)."""
    if not triton_available():
        raise KnobError(knob, "triton", "'torch' or 'auto' here: the triton package is not installed")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise KnobError(
            knob,
            "triton",
            f"'torch' or 'auto' on {device.type} (Triton kernels need a CUDA device; TRITON_INTERPRET=1 "
            "runs them in the slow Triton interpreter)",
        )


def _triton_backend() -> AttentionBackend:
    from nanoexp.kernels.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


class SkinnyGemm:
    """Routes x [M, K] @ w[N, K]^T with M <= max_rows to the Triton kernel."""

    def __init__(
        self,
        max_rows: int,
        max_weight_bytes: int | None = None,
        max_narrow_n: int = 0,
        max_narrow_rows: int = 0,
    ):
        """Up to `max_rows` rows; with `max_weight_bytes`, only weights up to that size, or up to
        `max_narrow_rows` rows of a weight of at most `max_narrow_n` outputs."""
        from nanoexp.kernels.triton_gemm import skinny_gemm  # only once Triton is known to be there

        self.max_rows = max_rows
        self.max_weight_bytes = max_weight_bytes
        self.max_narrow_n = max_narrow_n
        self.max_narrow_rows = max_narrow_rows
        self.kernel = skinny_gemm  # x @ weight^T + bias, optionally gated and normed first

    def applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        fits = x.dim() == 2 and x.shape[0] <= self.max_rows and x.stride(-1) == 1 and weight.stride(-1) == 1
        limit = self.max_weight_bytes  # `fits` first: prefill-sized inputs leave there
        if not fits or limit is None:
            return fits
        narrow = weight.shape[0] <= self.max_narrow_n and x.shape[0] <= self.max_narrow_rows
        return narrow or weight.numel() * weight.element_size() <= limit

    def describe(self) -> str:
        limit = f", weights up to {self.max_weight_bytes / 2**20:g} MiB" if self.max_weight_bytes else ""
        narrow = ""
        if self.max_weight_bytes and self.max_narrow_n and self.max_narrow_rows:
            narrow = (
                f"; up to {self.max_narrow_rows} row(s) of any weight of up to {self.max_narrow_n} outputs"
            )
        return f"triton up to {self.max_rows} rows{limit}{narrow}"


def make_skinny_gemm(choice: str, device: torch.device, dtype: torch.dtype) -> SkinnyGemm | None:
    """`engine.gemm_backend`: torch: None; triton: up to 256 rows; auto: the measured range (half precision
    on CUDA), or None."""
    if choice == "torch":
        return None
    if choice == "triton":
        require_triton("engine.gemm_backend", device)
        return SkinnyGemm(MAX_ROWS)
    if not triton_half_precision(device, dtype):
        return None
    return SkinnyGemm(AUTO_MAX_ROWS, AUTO_MAX_WEIGHT_BYTES, AUTO_MAX_NARROW_N, AUTO_MAX_NARROW_ROWS)


def make_moe_kernel(device: torch.device):
    """A MoE model's routing and experts: the Triton kernels (kernels/triton_moe.TritonMoe) on CUDA in every
    dtype (the torch reference syncs with the host to find each expert's tokens, so no CUDA graph could
    capture it); None (torch) on CPU."""
    if device.type != "cuda" or not triton_available():
        return None
    from nanoexp.kernels.triton_moe import make_triton_moe

    return make_triton_moe(device)


def make_fp8_gemm(choice: str, device: torch.device) -> Fp8Gemm:
    """The block-scaled fp8 GEMM: the Triton kernels on CUDA (or `triton` under the interpreter), with
    cuBLAS's block-scaled GEMM for prefill-sized steps under `auto` where it passes its check; else the
    torch reference of the same arithmetic (`torch`, and CPUs)."""
    from nanoexp.kernels.fp8_reference import w8a8_reference

    if choice == "torch" or not triton_available():
        return w8a8_reference
    if device.type != "cuda" and not (choice == "triton" and os.environ.get("TRITON_INTERPRET") == "1"):
        return w8a8_reference
    from nanoexp.kernels.fp8_cublas import blockwise_scaled_mm_works, cublas_fp8_linear
    from nanoexp.kernels.triton_fp8 import fp8_linear

    return cublas_fp8_linear if choice == "auto" and blockwise_scaled_mm_works(device) else fp8_linear


def make_fp8_input_kernels(gemm: Fp8Gemm) -> Fp8InputKernels | None:
    """For the Triton fp8 GEMMs (and cuBLAS's beside them): the add + RMSNorm and SwiGLU kernels that emit
    their input quantized, in the format the bound GEMM reads; None for the torch reference (CPUs)."""
    from nanoexp.kernels import fp8_cublas, triton_fp8

    if gemm is fp8_cublas.cublas_fp8_linear:
        activation_format = fp8_cublas.activation_format
    elif gemm is triton_fp8.fp8_linear:
        activation_format = triton_fp8.activation_format
    else:
        return None
    from nanoexp.kernels.triton_fp8_inputs import rms_norm_quantized, silu_and_mul_quantized

    return Fp8InputKernels(activation_format, rms_norm_quantized, silu_and_mul_quantized)
