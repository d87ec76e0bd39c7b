"""The fp8 Triton kernels against the torch W8A8 reference (kernels/fp8_reference.py): on CPU under the
interpreter (tiny shapes; it has no fp8 dot, so the GEMM multiplies the e4m3 operands as fp16, which holds
them exactly) and on the GPU with fp8 tensor cores, in CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from fp8_checkpoints import published_quantize
from helpers import quick_first

from nanoexp.kernels import triton_fp8
from nanoexp.kernels.fp8_reference import (
    FP8_DTYPE,
    Fp8Layout,
    group_amax,
    quantize_activation,
    quantize_weight,
    w8a8_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (n, k_local, k_start, row_block): aligned; a shard at offset 96 of a 128-block (two partial groups); a
# ragged K with per-row scales
LAYOUTS = [(256, 256, 0, 128), (40, 96, 96, 1), (48, 300, 0, 1)]


def assert_close(got: torch.Tensor, want: torch.Tensor, rows: int) -> None:
    """Equal up to fp32 summation order on the CPU; on a GPU, Hopper's fp8 tensor cores (more than one row)
    sum a block's products in fewer bits than fp32."""
    tol = 1e-6 if DEVICE == "cpu" else 1e-5 if rows == 1 else 5e-3
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert err <= tol, err


def random_weights(layout: Fp8Layout, device=DEVICE) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.zeros(layout.n, layout.k_padded, device=device)
    w[:, layout.k_offset : layout.k_offset + layout.k_local] = torch.randn(layout.n, layout.k_local) * 0.05
    q, s = quantize_weight(w)
    return q, s.repeat_interleave(128, 0)[: layout.n : layout.row_block].contiguous()


def test_quantize_weight_is_the_published_rule_with_ragged_blocks():
    w = torch.randn(200, 300) * 0.1
    w[:128, :128] = 0.0  # an all-zero block: scale 1, zeros
    q, s = quantize_weight(w)
    want_q, want_s = published_quantize(w)
    assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s)
    assert s.shape == (2, 3) and s[0, 0] == 1.0


def test_reference_is_blockwise_products_summed_then_rounded():
    """The definition, written out block by block: sum_b (xq_b . wq_b) * xs_b * ws_b, in float64, rounded
    once to float32."""
    torch.manual_seed(0)
    layout = Fp8Layout(8, 300, 0, 1)
    q, s = random_weights(layout, "cpu")
    x = torch.randn(3, 300, dtype=torch.float64).float()
    xq, xs = quantize_activation(x, layout)
    want = torch.zeros(3, 8, dtype=torch.float64)
    for b in range(layout.k_blocks):
        cols = slice(b * 128, (b + 1) * 128)
        dots = xq[:, cols].double() @ q[:, cols].double().T
        want += dots * xs[:, b, None].double() * s[None, :, b].double()
    assert torch.equal(w8a8_reference(x, q, s, layout), want.float())
    amax = x.abs().view(3, -1)[:, :128].amax(-1)
    assert torch.allclose(xs[:, 0], amax / 448) and xq.dtype == FP8_DTYPE


def test_reference_gives_a_row_the_same_bits_alone_or_in_a_batch():
    """The engine batches whatever requests are running: a token's product must not depend on its neighbours
    (a float32 GEMM's summation order does, through the shape the BLAS sees)."""
    torch.manual_seed(2)
    layout = Fp8Layout(384, 1024, 0, 128)
    q, s = random_weights(layout, "cpu")
    x = torch.randn(64, 1024)
    alone = torch.cat([w8a8_reference(x[i : i + 1], q, s, layout) for i in range(len(x))])
    assert torch.equal(w8a8_reference(x, q, s, layout), alone)


@pytest.mark.parametrize("shape", [*LAYOUTS, (16, 1100, 0, 1)])  # 9 groups: a program's 8, then 1 of 8
def test_activation_quantization_kernel_is_exact(shape):
    torch.manual_seed(1)
    layout = Fp8Layout(*shape)
    x = torch.randn(5, layout.k_local, device=DEVICE) * 3
    x[0, :4] = torch.tensor([0.0, 1e-9, -448.0, 447.9])
    x[1] = 0.0  # an all-zero row: the eps floor, zeros
    want_q, want_s = quantize_activation(x, layout)
    got_q, got_s = triton_fp8.quantize_activation(x, layout)
    assert torch.equal(got_q.float(), want_q.float()) and torch.equal(got_s, want_s)
    amax = group_amax(x, layout) * 2  # given amaxes (a group straddling TP ranks) are used as given
    want_q, want_s = quantize_activation(x, layout, amax)
    got_q, got_s = triton_fp8.quantize_activation(x, layout, amax)
    assert torch.equal(got_q.float(), want_q.float()) and torch.equal(got_s, want_s)


@pytest.mark.parametrize(
    *quick_first("rows", [1, 3, 4, 7, 20, 70], quick=4)
)  # the GEMV (<= 4 rows), the GEMM's small and large tiles
@pytest.mark.parametrize(*quick_first("shape", LAYOUTS, quick=1))
def test_fp8_linear_matches_the_reference(shape, rows):
    if DEVICE == "cpu" and rows == 70 and shape[0] > 64:
        pytest.skip("the 128 x 128 tile is slow in the interpreter; the smaller layouts cover it")
    torch.manual_seed(2)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    x = torch.randn(rows, layout.k_local, device=DEVICE)
    bias = torch.randn(layout.n, device=DEVICE)
    want = w8a8_reference(x, q, s, layout, bias)
    got = triton_fp8.fp8_linear(x, q, s, layout, bias)
    assert_close(got, want, rows)


GPU_CASES = [(torch.bfloat16, rows) for rows in (1, 2, 4, 5, 33, 65, 4096)] + [
    (torch.float32, 1),
    (torch.float32, 300),
]


@pytest.mark.gpu
@pytest.mark.gpu_quick
@pytest.mark.parametrize(("dtype", "rows"), GPU_CASES)
def test_gpu_fp8_linear_at_qwen3_8b_shapes(dtype, rows):
    torch.manual_seed(3)
    for n, k in ((6144, 4096), (4096, 12288)):
        layout = Fp8Layout(n, k, 0, 128)
        q, s = random_weights(layout)
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        want = w8a8_reference(x.float(), q, s, layout)
        got = triton_fp8.fp8_linear(x, q, s, layout).float()
        # bf16: Hopper's fp8 tensor cores sum a block's products in fewer bits than fp32, and the output
        # rounds to bf16; float32 runs multiply fp32 operands (EXACT_SUMS): only the summation order differs
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err <= tol, (rows, n, k, err)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 13, 40, 312])
@pytest.mark.parametrize("shape", [*LAYOUTS, (640, 256, 0, 1), (256, 320, 0, 128), (768, 256, 0, 1)])
def test_gpu_fp8_linear_in_float32_follows_the_reference_on_ragged_and_per_row_layouts(shape, rows):
    """The GPU test checkpoint's layouts (gate/up parts of 320 rows: scales per row; down_proj's K of 320:
    a ragged last block) and the CPU tests' ones, in float32, where only the summation order may differ."""
    torch.manual_seed(7)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout, device="cuda")
    x = torch.randn(rows, layout.k_local, device="cuda")
    want = w8a8_reference(x, q, s, layout)
    got = triton_fp8.fp8_linear(x, q, s, layout)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err <= 1e-5, err


@pytest.mark.gpu
@pytest.mark.gpu_quick
def test_gpu_fp8_linear_replays_in_a_cuda_graph():
    layout = Fp8Layout(384, 96, 96, 1)
    q, s = random_weights(layout)
    x = torch.randn(4, 96, device="cuda", dtype=torch.bfloat16)
    triton_fp8.fp8_linear(x, q, s, layout)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = triton_fp8.fp8_linear(x, q, s, layout)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want = w8a8_reference(x, q, s, layout)
    assert torch.allclose(y.float(), want.float(), rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("shape", LAYOUTS[1:])
def test_fp8_linear_with_given_amax_matches_the_reference(shape, rows):
    """The path of a row-parallel shard whose groups straddle ranks: quantization kernel, then the GEMV
    on quantized rows (or the GEMM)."""
    torch.manual_seed(4)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    x = torch.randn(rows, layout.k_local, device=DEVICE)
    amax = group_amax(x, layout) * 1.5
    want = w8a8_reference(x, q, s, layout, amax=amax)
    got = triton_fp8.fp8_linear(x, q, s, layout, amax=amax)
    assert_close(got, want, rows)


@pytest.mark.parametrize("rows", [5, 20])
@pytest.mark.parametrize("shape", [LAYOUTS[0], LAYOUTS[2]])
def test_gemm_quantizing_its_own_tiles_matches_the_reference(shape, rows):
    torch.manual_seed(5)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    x = torch.randn(rows, layout.k_local, device=DEVICE)
    config = triton_fp8.GemmConfig(16, 32, 4, 2, quantize_a=True)
    want = w8a8_reference(x, q, s, layout)
    got = triton_fp8.fp8_linear(x, q, s, layout, config=config)
    assert_close(got, want, rows)


@pytest.mark.parametrize("shape", [LAYOUTS[0], LAYOUTS[2]])
def test_one_row_of_a_wide_layer_takes_the_gemm_and_matches_the_reference(shape):
    assert not triton_fp8.uses_gemv(1, triton_fp8.GEMV_MAX_N, None)
    assert triton_fp8.uses_gemv(1, triton_fp8.GEMV_MAX_N - 1, None)
    torch.manual_seed(6)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    x = torch.randn(1, layout.k_local, device=DEVICE)
    config = triton_fp8.default_gemm_config(1, triton_fp8.GEMV_MAX_N)
    assert config == triton_fp8.GemmConfig(*triton_fp8.WIDE_ROW_GEMM)
    assert_close(triton_fp8.fp8_linear(x, q, s, layout, config=config), w8a8_reference(x, q, s, layout), 1)


@pytest.mark.gpu
@pytest.mark.gpu_quick
@pytest.mark.parametrize("rows", [1, 65, 300, 4096])  # 1: a wide layer's single row, padded to 16
def test_gpu_cublas_prefill_gemm_matches_the_reference(rows):
    from nanoexp.kernels.fp8_cublas import blockwise_scaled_mm_works, cublas_fp8_linear

    if not blockwise_scaled_mm_works(torch.device("cuda", torch.cuda.current_device())):
        pytest.skip("cuBLAS's block-scaled fp8 GEMM is not available here (CUDA < 12.9 or not Hopper)")
    torch.manual_seed(6)
    layout = Fp8Layout(6144, 4096, 0, 128)
    q, s = random_weights(layout)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    err = (
        (cublas_fp8_linear(x, q, s, layout).float() - w8a8_reference(x, q, s, layout).float()).abs().max()
    ).item()
    assert err <= 2e-2 * w8a8_reference(x, q, s, layout).float().abs().max().item()


@pytest.mark.parametrize(*quick_first("rows", [1, 3], quick=1))
@pytest.mark.parametrize(*quick_first("shape", [(40, 1024, 0, 1), (256, 512, 0, 128)]))
def test_split_k_gemv_matches_the_reference_twice(shape, rows):
    """K split across programs (partials summed by the last of a tile's programs); a second call finds
    the tickets reset."""
    torch.manual_seed(7)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    config = triton_fp8.GemvConfig(8, 2, 4, split_k=2)
    for _ in range(2):
        x = torch.randn(rows, layout.k_local, device=DEVICE)
        want = w8a8_reference(x, q, s, layout)
        assert_close(triton_fp8.fp8_linear(x, q, s, layout, config=config), want, 1)
    assert int(triton_fp8._tickets(torch.device(DEVICE)).abs().sum()) == 0


DEFERRED = [
    triton_fp8.GemvConfig(8, 4, deferred_sum=True),
    triton_fp8.GemvConfig(8, 2, 4, split_k=2, deferred_sum=True),
]


@pytest.mark.parametrize("config", DEFERRED, ids=["whole_k", "split_k"])
@pytest.mark.parametrize(*quick_first("shape", [*LAYOUTS, (40, 1024, 0, 1)], quick=1))
def test_gemv_summing_once_after_the_k_loop_matches_the_reference(shape, config):
    """The one-row candidate that adds w * x * scales elementwise over the K loop and reduces once: the
    reference's value up to fp32 summation order, quantizing its row itself or reading it quantized."""
    torch.manual_seed(8)
    layout = Fp8Layout(*shape)
    q, s = random_weights(layout)
    x = torch.randn(1, layout.k_local, device=DEVICE)
    want = w8a8_reference(x, q, s, layout)
    assert_close(triton_fp8.fp8_linear(x, q, s, layout, config=config), want, 1)  # quantizes its row
    xq, xs = quantize_activation(x, layout)
    assert_close(triton_fp8.fp8_matmul(xq, xs, q, s, layout, x.dtype, config), want, 1)
    assert int(triton_fp8._tickets(torch.device(DEVICE)).abs().sum()) == 0


def test_gemv_sums_once_for_one_row_only():
    assert triton_fp8.default_gemv_config(4096, 132) == triton_fp8.GemvConfig(8, 4, deferred_sum=True)
    assert not triton_fp8.default_gemv_config(4096, 132, rows=2).deferred_sum
    layout = Fp8Layout(40, 96, 0, 1)
    q, s = random_weights(layout)
    with pytest.raises(ValueError, match="one row, got 2"):
        triton_fp8.fp8_linear(torch.randn(2, 96, device=DEVICE), q, s, layout, config=DEFERRED[0])


@pytest.mark.gpu
@pytest.mark.gpu_quick
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_gemv_summing_once_at_qwen3_8b_shapes(dtype):
    """o_proj (quantizing its row) and down_proj (K = 12,288: a quantization launch first), one row."""
    torch.manual_seed(9)
    for n, k in ((4096, 4096), (4096, 12288)):
        layout = Fp8Layout(n, k, 0, 128)
        q, s = random_weights(layout)
        x = torch.randn(1, k, device="cuda", dtype=dtype)
        want = w8a8_reference(x.float(), q, s, layout)
        for config in DEFERRED:
            got = triton_fp8.fp8_linear(x, q, s, layout, config=config).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err <= (1e-2 if dtype == torch.bfloat16 else 1e-5), (n, k, config, err)  # bf16: its output
