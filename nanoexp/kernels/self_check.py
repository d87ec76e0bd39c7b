"""A one-time check of an attention backend against the torch reference on a small paged case.

Through the real interface: store_kv, a decode batch, a prefill after a cached prefix (next to one
without) and a plain prefill. The reference runs in float32 on the same dtype-rounded inputs, so the
tolerance covers only the backend's rounding; store_kv must write the reference's exact bytes."""

from __future__ import annotations

import functools
from itertools import accumulate
from typing import NamedTuple

import torch

from nanoexp.kernels.base import FP8_DTYPE, AttentionBackend, AttentionMetadata
from nanoexp.kernels.torch_ref import TorchAttentionBackend, quantize_fp8

# Max abs error on outputs of magnitude ~1; a wrong mask, page or scale shows as 0.1 and more.
TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
NUM_HEADS, NUM_KV_HEADS = 8, 2  # grouped-query, as in the Qwen3 models
# fp8 scales: N(0, 1) values use most of e4m3's range; K and V differ so a swapped scale shows.
FP8_K_SCALE, FP8_V_SCALE = 0.02, 0.03


class CheckResult(NamedTuple):
    ok: bool
    reason: str  # "max error E <= tolerance T", "max error E > tolerance T" or the exception


_results: dict[tuple, CheckResult] = {}


class SelfCheckError(Exception):
    pass


def check_backend(
    backend: AttentionBackend,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    block_size: int,
    kv_fp8: bool = False,
) -> CheckResult:
    """Compare `backend` with the reference, once per process per backend and case shape."""
    key = (type(backend), backend.name, torch.device(device), dtype, head_dim, block_size, kv_fp8)
    if key not in _results:
        _results[key] = _run_check(backend, torch.device(device), dtype, head_dim, block_size, kv_fp8)
    return _results[key]


def _run_check(backend, device, dtype, head_dim, block_size, kv_fp8) -> CheckResult:
    tolerance = TOLERANCE[dtype]
    try:
        error = max_error(backend, device, dtype, head_dim, block_size, kv_fp8=kv_fp8)
    except SelfCheckError as exc:
        return CheckResult(False, str(exc))
    except Exception as exc:  # a backend that cannot run this case must not be chosen
        return CheckResult(False, describe(exc))
    if error <= tolerance:
        return CheckResult(True, f"max error {error:.2e} <= tolerance {tolerance:.0e}")
    return CheckResult(False, f"max error {error:.2e} > tolerance {tolerance:.0e} ({dtype})")


def describe(exc: BaseException) -> str:
    """One line naming an exception: its type and the first line of its message."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"raised {type(exc).__name__}: {first_line}"


def paged_case(ctx_lens, q_lens, has_prefill, block_size, kv_heads, head_dim, dtype, device, gen, kv_fp8):
    """Random paged K/V caches (fp8 with `kv_fp8`, then with their scales) of sequences of ctx_lens
    tokens, and the metadata of a step adding the last q_lens of them: (k_cache, v_cache, scales, md)."""
    need = [-(-n // block_size) for n in ctx_lens]
    num_blocks = sum(need) + 2
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2))
    scales = ()
    if kv_fp8:
        scales = (torch.tensor([FP8_K_SCALE], device=device), torch.tensor([FP8_V_SCALE], device=device))
        k_cache, v_cache = quantize_fp8(k_cache, scales[0]), quantize_fp8(v_cache, scales[1])
    pages = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(ctx_lens), max(need), dtype=torch.int32)
    slots = []
    for i, (n, ctx, q) in enumerate(zip(need, ctx_lens, q_lens, strict=True)):
        table[i, :n] = torch.tensor(pages[:n], dtype=torch.int32)
        slots += [pages[p // block_size] * block_size + p % block_size for p in range(ctx - q, ctx)]
        pages = pages[n:]
    cu_q, cu_k = ([0, *accumulate(lens)] for lens in (q_lens, ctx_lens))
    ints = functools.partial(torch.tensor, dtype=torch.int32, device=device)
    md = AttentionMetadata(
        has_prefill,
        ints(slots, dtype=torch.int64),
        ints(ctx_lens),
        table.to(device),
        ints(cu_q) if has_prefill else None,
        ints(cu_k) if has_prefill else None,
        max(q_lens),
        max(ctx_lens),
        has_cached_prefix=has_prefill and any(c > q for c, q in zip(ctx_lens, q_lens, strict=True)),
    )
    return k_cache, v_cache, scales, md


def max_error(
    backend,
    device,
    dtype,
    head_dim,
    block_size,
    cases=None,
    heads=(NUM_HEADS, NUM_KV_HEADS),
    seed=1234,
    kv_fp8=False,
) -> float:
    """Largest abs difference from the reference over store_kv, decode and both prefill kinds; cases:
    (context lengths, new tokens per sequence, has_prefill)."""
    cases = cases or [
        ([1, block_size + 3, 37], [1, 1, 1], False),
        ([block_size + 30, 9], [30, 9], True),  # 30 new tokens after one cached block
        ([17, 5], [17, 5], True),
    ]
    gen = torch.Generator().manual_seed(seed)
    num_heads, kv_heads = heads
    errors = []
    for ctx_lens, q_lens, has_prefill in cases:
        k_cache, v_cache, scales, md = paged_case(
            ctx_lens, q_lens, has_prefill, block_size, kv_heads, head_dim, dtype, device, gen, kv_fp8
        )
        n = md.slot_mapping.shape[0]
        q = torch.randn(n, num_heads, head_dim, generator=gen).to(device, dtype)
        k, v = (torch.randn(n, kv_heads, head_dim, generator=gen).to(device, dtype) for _ in range(2))
        errors.append(_compare(backend, k_cache, v_cache, scales, md, q, k, v, head_dim**-0.5))
    return max(errors)


def _compare(backend, k_cache, v_cache, scales: tuple, md: AttentionMetadata, q, k, v, scale: float) -> float:
    reference = TorchAttentionBackend()
    # copy=True: for float32 caches .float() would alias them, and the reference would store into them.
    k_ref, v_ref = (c.to(FP8_DTYPE if scales else torch.float32, copy=True) for c in (k_cache, v_cache))
    reference.store_kv(k.float(), v.float(), k_ref, v_ref, md.slot_mapping, *scales)
    backend.store_kv(k, v, k_cache, v_cache, md.slot_mapping, *scales)
    if not (_same(k_cache, k_ref) and _same(v_cache, v_ref)):
        raise SelfCheckError("store_kv wrote different K/V than the reference (it must copy exactly)")
    if md.has_prefill:
        want = reference.prefill(q.float(), k.float(), v.float(), k_ref, v_ref, md, scale, *scales)
        got = backend.prefill(q, k, v, k_cache, v_cache, md, scale, *scales)
    else:
        want = reference.decode(q.float(), k_ref, v_ref, md, scale, *scales)
        got = backend.decode(q, k_cache, v_cache, md, scale, *scales)
    kind = "prefill" if md.has_prefill else "decode"
    if got.shape != want.shape:
        raise SelfCheckError(f"{kind} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise SelfCheckError(f"{kind} returned non-finite values")
    return float((got.float() - want).abs().max())


def _same(cache: torch.Tensor, reference: torch.Tensor) -> bool:
    """Bit-equal for fp8 caches (so -0.0 and NaN bytes count); value-equal otherwise."""
    if reference.dtype == FP8_DTYPE:
        return torch.equal(cache.view(torch.uint8), reference.view(torch.uint8))
    return torch.equal(cache.float(), reference)
