"""The Triton skinny GEMM (decode-sized linear layers) against torch, and its engine wiring.

On CPU the kernel runs in the Triton interpreter (conftest turns it on), so shapes stay small."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from checkpoints import random_prompts  # noqa: E402
from helpers import quick_first  # noqa: E402

from nanoexp import LLM, SamplingParams  # noqa: E402
from nanoexp.config import ExecutionConfig, KnobError  # noqa: E402
from nanoexp.kernels.base import NormFirst  # noqa: E402
from nanoexp.kernels.select import (  # noqa: E402
    AUTO_MAX_NARROW_N,
    AUTO_MAX_NARROW_ROWS,
    AUTO_MAX_ROWS,
    AUTO_MAX_WEIGHT_BYTES,
    SkinnyGemm,
    make_skinny_gemm,
)
from nanoexp.kernels.triton_gemm import NORM_PREPASS_MAX_ROWS, GemmConfig, default_config, skinny_gemm  # noqa: E402
from nanoexp.kernels.triton_gemv import MAX_K_TILE, GemvConfig, default_gemv_config  # noqa: E402
from nanoexp.layers.norm import add_rms_norm, rms_norm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    "rows, n, k, config",
    [
        (1, 64, 256, GemmConfig(32, 128, 1)),
        (3, 96, 200, GemmConfig(32, 64, 4)),  # K not a multiple of the block, split-K
        (17, 40, 130, GemmConfig(16, 32, 2)),  # N not a multiple of the tile
        (64, 32, 512, GemmConfig(32, 128, 8)),
    ],
)
def test_skinny_gemm_matches_torch(rows, n, k, config):
    gen = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(*shape, generator=gen).to(DEVICE) for shape in ((rows, k), (n, k), (n,)))
    for bias in (None, b):
        for _ in range(2):  # the split-K tickets must be reset by the first call
            got = skinny_gemm(x, w, bias, config)
            torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-4, atol=1e-4)


def test_default_config_splits_k_only_when_tiles_are_few():
    assert default_config(4096, 1024, 132).split_k == 1  # 128 tiles of 32 columns
    narrow = default_config(1024, 3072, 132)  # 32 tiles
    assert narrow.split_k == 4 and 3072 // narrow.split_k >= narrow.block_k


def test_gemm_backend_knob():
    with pytest.raises(KnobError, match="engine.gemm_backend='cublas' is invalid"):
        ExecutionConfig(gemm_backend="cublas")
    assert make_skinny_gemm("torch", DEVICE, torch.bfloat16) is None
    assert make_skinny_gemm("auto", torch.device("cpu"), torch.bfloat16) is None
    assert make_skinny_gemm("auto", DEVICE, torch.float32) is None  # fp32 keeps cuBLAS' exact products
    if DEVICE.type == "cuda":
        assert make_skinny_gemm("auto", DEVICE, torch.bfloat16).max_rows == AUTO_MAX_ROWS


def test_auto_leaves_large_weights_to_cublas():
    gemm = SkinnyGemm(AUTO_MAX_ROWS, AUTO_MAX_WEIGHT_BYTES)
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    small = torch.zeros(AUTO_MAX_WEIGHT_BYTES // 2048, 1024, dtype=torch.bfloat16)  # exactly the limit
    large = torch.zeros(small.shape[0] + 1, 1024, dtype=torch.bfloat16)
    assert gemm.applies(x, small) and not gemm.applies(x, large)
    assert not gemm.applies(torch.zeros(AUTO_MAX_ROWS + 1, 1024, dtype=torch.bfloat16), small)
    assert SkinnyGemm(64).applies(x, large)  # engine.gemm_backend=triton: no size limit
    assert gemm.describe() == "triton up to 16 rows, weights up to 12 MiB"


def test_auto_takes_one_row_of_narrow_layers_of_any_size():
    """Qwen3-30B-A3B's o_proj (2048 outputs, 16 MiB): at one row cuBLAS splits its K over two launches;
    from 16 rows cuBLAS is faster."""
    gemm = SkinnyGemm(AUTO_MAX_ROWS, AUTO_MAX_WEIGHT_BYTES, AUTO_MAX_NARROW_N, AUTO_MAX_NARROW_ROWS)
    row, rows = (torch.zeros(n, 4096, dtype=torch.bfloat16) for n in (1, AUTO_MAX_NARROW_ROWS + 1))
    o_proj = torch.zeros(AUTO_MAX_NARROW_N, 4096, dtype=torch.bfloat16)
    qkv = torch.zeros(AUTO_MAX_NARROW_N + 1, 4096, dtype=torch.bfloat16)
    assert gemm.applies(row, o_proj) and not gemm.applies(row, qkv)
    assert not gemm.applies(rows, o_proj)
    small = torch.zeros(AUTO_MAX_NARROW_N, 1024, dtype=torch.bfloat16)  # 4 MiB: up to 16 rows either way
    assert gemm.applies(rows, small)
    assert gemm.describe() == (
        "triton up to 16 rows, weights up to 12 MiB; up to 1 row(s) of any weight of up to 2048 outputs"
    )


@pytest.mark.slow  # a whole engine under the Triton interpreter; the kernel tests above cover the kernel
def test_engine_with_triton_gemm_matches_torch_gemm(checkpoints):
    path, _ = checkpoints["qwen2_gqa2"]  # Qwen2: the q/k/v projections carry a bias
    prompts = random_prompts([5, 9, 3], seed=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        with LLM(
            path,
            device=DEVICE.type,
            dtype="float32",
            gemm_backend=backend,
            kv_block_size=16,
            max_model_len=256,
        ) as llm:
            outs[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            assert llm.stats()["gemm_backend"] == ("torch" if backend == "torch" else "triton up to 256 rows")
    assert outs["triton"] == outs["torch"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("n, k", [(4096, 1024), (1024, 3072), (1000, 1000)])
def test_skinny_gemm_bf16_on_gpu(rows, n, k):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
    ref = F.linear(x.float(), w.float())
    for _ in range(3):
        torch.testing.assert_close(skinny_gemm(x, w).float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "rows, inter, k, config", [(1, 48, 64, GemmConfig(16, 32, 1)), (5, 40, 96, GemmConfig(32, 32, 2))]
)
def test_gated_skinny_gemm_is_silu_of_gate_times_up(rows, inter, k, config):
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(rows, k, generator=gen).to(DEVICE), torch.randn(2 * inter, k, generator=gen).to(DEVICE)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    for _ in range(2):
        got = skinny_gemm(x, w, None, config, gated=True)
        torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 7, 16, 64])
def test_gated_skinny_gemm_bf16_on_gpu(rows):
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2 * 3072, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    ref = (F.silu(gate) * up).float()
    for _ in range(3):
        torch.testing.assert_close(skinny_gemm(x, w, gated=True).float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_norm_first_matches_rms_norm_then_linear(residual, gated):
    gen = torch.Generator().manual_seed(3)
    rows, n, k = 3, 40, 96
    x, r = (torch.randn(rows, k, generator=gen).to(DEVICE) for _ in range(2))
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(DEVICE)
    w = (torch.randn(2 * n if gated else n, k, generator=gen) / k**0.5).to(DEVICE)
    if residual:
        normed, summed = add_rms_norm(x, r, g, 1e-6)
    else:
        normed, summed = rms_norm(x, g, 1e-6), x
    ref = F.linear(normed, w)
    if gated:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    for _ in range(2):
        norm = NormFirst(g, 1e-6, r if residual else None)
        got, got_sum = skinny_gemm(x, w, None, GemmConfig(16, 32, 2), gated, norm)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(got_sum, summed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 9, 64, 128, 256])  # GEMV, norm pass, norm in the K loop, row tiles
@pytest.mark.parametrize("gated", [False, True])
def test_norm_first_bf16_on_gpu(rows, gated):
    gen = torch.Generator(device="cuda").manual_seed(2)
    x, r = (torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    g = 1 + 0.1 * torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(6144 if gated else 4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    normed, summed = add_rms_norm(x, r, g, 1e-6)
    ref = F.linear(normed, w)
    if gated:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    # Above NORM_PREPASS_MAX_ROWS the norm is applied in the K loop: x * g is rounded to bf16 for
    # the product and 1/rms scales it afterwards, where the reference rounds the normed x. Gate and
    # up may then differ by one bf16 ulp (0.03 at |4|), which SwiGLU carries to its output.
    tol = 2e-2 if rows <= NORM_PREPASS_MAX_ROWS else 4e-2
    for _ in range(3):
        got, got_sum = skinny_gemm(x, w, None, None, gated, NormFirst(g, 1e-6, r))
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=tol)
        assert torch.equal(got_sum, summed)


@pytest.mark.slow
def test_tp2_with_triton_gemm_matches_tp1_torch_gemm(checkpoints, monkeypatch):
    """Row-parallel layers all-reduce the kernel's partial products; the fused norm reads the
    replicated hidden state on every rank."""
    # Triton's interpreter makes the first step take tens of seconds on a busy 2-core machine, past
    # the workers' default 60 s step deadline (a hang guard, not what this test checks)
    monkeypatch.setenv("NANOEXP_TP_STEP_TIMEOUT_S", "900")
    path, _ = checkpoints["qwen3_gqa2_tied"]
    prompts = random_prompts([7, 12], seed=5)
    # a prefill and two decode steps: each interpreted step costs seconds on every rank
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outs = {}
    for backend, tp in (("torch", 1), ("triton", 2)):
        with LLM(
            path,
            device="cpu",
            dtype="float32",
            gemm_backend=backend,
            tensor_parallel_size=tp,
            kv_block_size=16,
            max_model_len=256,
        ) as llm:
            outs[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            assert llm.stats()["gemm_backend"] == ("torch" if tp == 1 else "triton up to 256 rows")
    assert outs["triton"] == outs["torch"]


@pytest.mark.parametrize(
    *quick_first(
        "rows, n, k, config",
        [
            (1, 64, 256, None),  # the default: one K tile
            (
                2,
                40,
                200,
                GemvConfig(16, 64),
            ),  # N not a multiple of the tile, K split 4 ways with a ragged end
            (4, 96, 128, GemvConfig(8, 32)),
            (3, 24, 96, GemvConfig(4, 128)),  # rows padded to 4, K shorter than its tile
        ],
        quick=1,
    )
)
@pytest.mark.parametrize(
    *quick_first("gated, normed", [(False, False), (True, False), (False, True), (True, True)], quick=3)
)
def test_gemv_matches_torch(rows, n, k, config, gated, normed):
    """The GEMV path (up to GEMV_MAX_ROWS rows) with bias, SwiGLU, RMSNorm first and split K."""
    check_against_unfused_ops(rows, n, k, config, gated, normed, seed=rows + 10 * gated + 20 * normed)


def check_against_unfused_ops(rows, n, k, config, gated, normed, seed):
    """skinny_gemm (with bias, or SwiGLU when gated; RMSNorm(x + residual) first when normed)
    against the unfused torch ops, in float32, twice (split-K tickets are reset by the first call)."""
    gen = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(rows, k, generator=gen).to(DEVICE) for _ in range(2))
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(DEVICE)
    w = (torch.randn(2 * n if gated else n, k, generator=gen) / k**0.5).to(DEVICE)
    bias = None if gated else torch.randn(n, generator=gen).to(DEVICE)
    normed_x, summed = add_rms_norm(x, r, g, 1e-6) if normed else (x, x)
    ref = F.linear(normed_x, w, bias)
    if gated:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    norm = NormFirst(g, 1e-6, r) if normed else None
    for _ in range(2):
        got = skinny_gemm(x, w, bias, config, gated, norm)
        if normed:
            got, got_sum = got
            assert torch.equal(got_sum, summed)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_gemv_config_fills_the_gpu_and_splits_long_k():
    qkv = default_gemv_config(4096, 1024, 132)
    assert (qkv.k_tile, 4096 // qkv.block_n) == (1024, 512)
    down = default_gemv_config(1024, 3072, 132)
    assert down.k_tile == 1024 and -(-1024 // down.block_n) * 3 >= 3 * 132
    assert default_gemv_config(64, 96, 132) == GemvConfig(2, 128)
    assert down.num_warps == 8 and qkv.num_warps == 4
    wide = default_gemv_config(200_000, 4096, 132, max_split_tiles=8192)  # split K: a ticket per tile
    assert -(-200_000 // wide.block_n) <= 8192


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "shape",
    [
        (4096, 1024, False),
        (3072, 1024, True),
        (1024, 2048, False),
        (1024, 3072, False),
        (3072, 4096, False),
        (6144, 4096, True),
    ],
    ids=["qkv", "gate_up", "o", "down", "qkv_8b_tp2", "gate_up_8b_tp2"],
)
def test_gemv_bf16_on_gpu_matches_tensor_core_kernel(rows, shape):
    """Qwen3-0.6B's layer shapes with the norm first: the GEMV and the tensor-core kernel agree to
    bf16 rounding (they sum in different orders)."""
    n, k, gated = shape
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x, r = (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    g = 1 + 0.1 * torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2 * n if gated else n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
    norm = NormFirst(g, 1e-6, r)
    ref, ref_sum = skinny_gemm(x, w, None, default_config(n, k, 132), gated, norm)
    # K split with the norm first: 1 / rms scales the product instead of rounding the normed x
    # (one bf16 ulp of gate or up, carried by SwiGLU; see test_norm_first_bf16_on_gpu).
    tol = 2e-2 if k <= MAX_K_TILE else 4e-2
    for _ in range(3):
        got, got_sum = skinny_gemm(x, w, None, None, gated, norm)
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=tol)
        assert torch.equal(got_sum, ref_sum)


@pytest.mark.parametrize(
    "rows, config",
    [
        (40, GemmConfig(16, 32, 1, block_m=16)),  # three row tiles, the last ragged
        (70, GemmConfig(32, 64, 2, block_m=32)),  # row tiles and split K (split only without the norm)
    ],
)
@pytest.mark.parametrize(
    *quick_first("gated, normed", [(False, False), (True, False), (False, True), (True, True)], quick=3)
)
def test_row_tiles_and_norm_in_the_k_loop_match_torch(rows, config, gated, normed):
    """Above NORM_PREPASS_MAX_ROWS rows the norm's sums of squares come from the product's own K
    loop and 1 / rms scales the product: it rounds x * norm_w, not the normed x, so it matches the
    unfused ops to rounding (float32 here)."""
    check_against_unfused_ops(rows, 40, 96, config, gated, normed, seed=rows + 2 * gated + 4 * normed)


def test_default_config_counts_row_tiles():
    assert default_config(1024, 3072, 132).split_k == 4  # 32 column tiles
    assert default_config(1024, 3072, 132, rows=256).split_k == 1  # x 4 row tiles of 64
