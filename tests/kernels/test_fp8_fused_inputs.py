"""The producers that emit an fp8 linear layer's input quantized (kernels/triton_fp8_inputs.py) against the
unfused pair they replace (the op, rounded to the model dtype, then fp8_reference.quantize_activation), in
both scale layouts; the layers that take such input. CPU: the Triton interpreter, fp16 and fp32; GPU: bf16
and fp32 at Qwen3-8B's shapes, and in a CUDA graph with PDL."""

from __future__ import annotations

import pytest
import torch

from nanoexp.kernels import fp8_cublas, triton_fp8
from nanoexp.kernels.fp8_reference import (
    ActivationFormat,
    Fp8Layout,
    QuantizedActivation,
    quantize_activation,
    quantize_weight,
    w8a8_reference,
)
from nanoexp.kernels.triton_fp8_inputs import rms_norm_quantized, silu_and_mul_quantized
from nanoexp.kernels.triton_swiglu import silu_and_mul
from nanoexp.layers.norm import add_rms_norm, rms_norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
# K: two whole groups; a ragged last group; nine groups (a SwiGLU program's eight, then one)
WIDTHS = [256, 300, 1100]


def unfused_norm(x, residual, weight, layout):
    """layers/norm.py's op, then the reference quantization: ((q, scales), x + residual)."""
    normed, summed = (
        (rms_norm(x, weight, EPS), x) if residual is None else add_rms_norm(x, residual, weight, EPS)
    )
    return quantize_activation(normed, layout), summed


def formats(layout: Fp8Layout, tokens: int) -> list[ActivationFormat]:
    """Row-major scales (the Triton GEMMs'), and M-major with padded rows (cuBLAS's)."""
    return [ActivationFormat(layout, tokens, False), ActivationFormat(layout, -(-tokens // 16) * 16, True)]


def assert_padding_is_zero(got: QuantizedActivation) -> None:
    assert not got.q[got.tokens :].float().any() and not got.scales[got.tokens :].any()


def e4m3_codes(q: torch.Tensor) -> torch.Tensor:
    """The e4m3 bit patterns as ints, -0 as +0: Triton's rounding gives +0 where torch's cast keeps a tiny
    negative value's sign; the two are the same value."""
    codes = q.view(torch.uint8).int()
    return torch.where(codes == 0x80, 0, codes)


def assert_same_codes(
    got: QuantizedActivation, want: tuple[torch.Tensor, torch.Tensor], max_flips: float, scale_rtol: float
) -> None:
    """Equal codes, but for a fraction `max_flips` of the elements one e4m3 step apart, and scales within
    scale_rtol: a sum in another order moves 1 / rms (or exp) by an ulp, hence a row's scales by an ulp in
    float32, a group's amax by one of the model dtype where it rounds the other way."""
    (q, s), (want_q, want_s) = got.row_major(), want
    codes = (e4m3_codes(q) - e4m3_codes(want_q)).abs()
    assert (codes != 0).float().mean().item() <= max_flips and codes.max().item() <= 1
    assert torch.allclose(s, want_s, rtol=2 * scale_rtol, atol=0)


def ulp(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("k", WIDTHS)
def test_rms_norm_quantized_equals_the_unfused_pair_in_fp16(k, residual):
    torch.manual_seed(0)
    layout = Fp8Layout(64, k, 0, 1)
    x, r = (torch.randn(5, k, device=DEVICE, dtype=torch.float16) * 4 for _ in range(2))
    x[0, :3] = 0.0
    weight = (torch.rand(k, device=DEVICE) + 0.5).half()
    (want_q, want_s), want_sum = unfused_norm(x, r if residual else None, weight, layout)
    for fmt in formats(layout, 5):
        got, summed = rms_norm_quantized(x, r if residual else None, weight, EPS, fmt)
        q, s = got.row_major()
        assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s), fmt
        assert torch.equal(summed, want_sum) and got.dtype == torch.float16 and got.shape == (5, k)
        assert_padding_is_zero(got)
    if not residual:
        assert summed is x  # as RMSNorm without a residual: x itself is the next residual


@pytest.mark.parametrize("k", WIDTHS[:2])
def test_rms_norm_quantized_follows_the_unfused_pair_in_fp32(k):
    """In float32 the normed value is not rounded, so the kernel's order of the sum of squares shows."""
    torch.manual_seed(1)
    layout = Fp8Layout(64, k, 0, 1)
    x, r = torch.randn(7, k, device=DEVICE), torch.randn(7, k, device=DEVICE)
    weight = torch.rand(k, device=DEVICE) + 0.5
    want, want_sum = unfused_norm(x, r, weight, layout)
    got, summed = rms_norm_quantized(x, r, weight, EPS, formats(layout, 7)[1])
    assert torch.equal(summed, want_sum)
    assert_same_codes(got, want, 2e-3, ulp(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("k", WIDTHS)
def test_silu_and_mul_quantized_equals_the_unfused_pair(k, dtype):
    torch.manual_seed(2)
    layout = Fp8Layout(64, k, 0, 1)
    gate_up = (torch.randn(5, 2 * k, device=DEVICE) * 3).to(dtype)
    want_q, want_s = quantize_activation(silu_and_mul(gate_up), layout)
    for fmt in formats(layout, 5):
        got = silu_and_mul_quantized(gate_up, fmt)
        q, s = got.row_major()
        assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s), fmt
        assert got.shape == (5, k) and got.dtype == dtype
        assert_padding_is_zero(got)


def test_a_producer_refuses_a_layout_at_an_offset():
    layout = Fp8Layout(64, 96, 96, 1)  # a TP shard whose groups straddle ranks quantizes its own input
    with pytest.raises(AssertionError, match="whole groups"):
        silu_and_mul_quantized(torch.randn(3, 192, device=DEVICE), ActivationFormat(layout, 3, False))


@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("shape", [(256, 256, 0, 128), (48, 300, 0, 1)])
def test_fp8_linear_on_quantized_input_equals_quantizing_itself(shape, rows):
    """The GEMV (one row) and the GEMM read a producer's output, row-major or M-major, as their own."""
    torch.manual_seed(3)
    layout = Fp8Layout(*shape)
    w = torch.zeros(layout.n, layout.k_padded, device=DEVICE)
    w[:, : layout.k_local] = torch.randn(layout.n, layout.k_local) * 0.05
    q, s = quantize_weight(w)
    s = s.repeat_interleave(128, 0)[: layout.n : layout.row_block].contiguous()
    gate_up = torch.randn(rows, 2 * layout.k_local, device=DEVICE)
    act = silu_and_mul(gate_up)
    want = triton_fp8.fp8_linear(act, q, s, layout)
    assert torch.allclose(want, w8a8_reference(act, q, s, layout), rtol=1e-5, atol=1e-6)
    for fmt in formats(layout, rows):
        quantized = silu_and_mul_quantized(gate_up, fmt)
        assert torch.equal(triton_fp8.fp8_linear(quantized, q, s, layout), want), fmt
        assert torch.equal(w8a8_reference(quantized, q, s, layout), w8a8_reference(act, q, s, layout))


def test_activation_formats_follow_the_gemm_that_reads_them():
    layout = Fp8Layout(256, 512, 0, 128)
    rows = fp8_cublas.MIN_ROWS
    assert fp8_cublas.activation_format(layout, rows, torch.bfloat16) == ActivationFormat(layout, 80, True)
    assert fp8_cublas.activation_format(layout, rows - 1, torch.bfloat16) == ActivationFormat(
        layout, 64, False
    )
    assert fp8_cublas.activation_format(layout, rows, torch.float32) == ActivationFormat(layout, rows, False)
    ragged = Fp8Layout(256, 300, 0, 1)  # a layout cuBLAS cannot take: the Triton kernels' format
    assert fp8_cublas.activation_format(ragged, 300, torch.bfloat16) == ActivationFormat(ragged, 300, False)
    assert triton_fp8.activation_format(layout, 7, torch.bfloat16) == ActivationFormat(layout, 7, False)
    wide = Fp8Layout(triton_fp8.GEMV_MAX_N, 512, 0, 128)  # one row of it on cuBLAS, padded; two rows not
    assert fp8_cublas.activation_format(wide, 1, torch.bfloat16) == ActivationFormat(wide, 16, True)
    assert fp8_cublas.activation_format(wide, 2, torch.bfloat16) == ActivationFormat(wide, 2, False)
    assert fp8_cublas.activation_format(layout, 1, torch.bfloat16) == ActivationFormat(layout, 1, False)


def test_only_layers_whose_groups_are_their_own_take_quantized_input(monkeypatch):
    from nanoexp.kernels.select import make_fp8_input_kernels
    from nanoexp.layers import linear
    from nanoexp.layers.quantization import building

    monkeypatch.setattr(linear, "tp_size", lambda: 2)
    x = torch.randn(3, 192)
    kernels = make_fp8_input_kernels(triton_fp8.fp8_linear)
    assert kernels is not None and make_fp8_input_kernels(w8a8_reference) is None
    taken = {}
    for rank in (0, 1):
        monkeypatch.setattr(linear, "tp_rank", lambda rank=rank: rank)
        with building("fp8"):
            down = linear.RowParallelLinear(
                384, 192
            )  # rank 1's K shard starts at 192: offset 64 in its block
            gate_up = linear.MergedColumnParallelLinear(192, [384, 384])
        assert down.input_producer(x) is None and gate_up.input_producer(x) is None  # nothing bound yet
        for layer in (down, gate_up):
            assert layer.fp8 is not None
            layer.fp8.input_kernels = kernels
        taken[rank] = (down.input_producer(x) is not None, gate_up.input_producer(x) is not None)
    assert taken == {0: (False, True), 1: (False, True)}  # down_proj's groups straddle the ranks: its own
    with building("fp8"):
        whole_groups = linear.RowParallelLinear(512, 192)  # 256 columns a rank: its groups are its own
    assert whole_groups.fp8 is not None
    whole_groups.fp8.input_kernels = kernels
    assert whole_groups.input_producer(x) == (
        kernels,
        triton_fp8.activation_format(whole_groups.fp8.layout, 3, x.dtype),
    )


# ---------------------------------------------------------------- GPU

GPU_ROWS = [1, 16, 65, 4096]


@pytest.mark.gpu
@pytest.mark.gpu_quick
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", GPU_ROWS)
def test_gpu_fused_producers_follow_the_unfused_ones_at_qwen3_8b_shapes(rows, dtype):
    """add + RMSNorm before qkv_proj / gate_up_proj (K = 4,096) and SwiGLU before down_proj (K = 12,288),
    in the format the engine's GEMM reads (cuBLAS's M-major from 65 bf16 rows). The unfused ops are torch's
    (CUDA's reductions sum in another order) and the Triton SwiGLU: codes may differ by a step, rarely."""
    torch.manual_seed(4)
    hidden, inter = 4096, 12288
    norm_layout, down_layout = Fp8Layout(6144, hidden, 0, 128), Fp8Layout(hidden, inter, 0, 128)
    x, r = (torch.randn(rows, hidden, device="cuda", dtype=dtype) for _ in range(2))
    weight = (torch.rand(hidden, device="cuda") + 0.5).to(dtype)
    fmt = fp8_cublas.activation_format(norm_layout, rows, dtype)
    got, summed = rms_norm_quantized(x, r, weight, EPS, fmt)
    want, want_sum = unfused_norm(x, r, weight, norm_layout)
    assert torch.equal(summed, want_sum)
    scale_rtol = ulp(dtype) * (8 if dtype == torch.float32 else 1)  # CUDA's rsqrt and exp: a few ulps
    # bf16: the normed value rounds to 8 bits after a sum in another order; of the values that move an ulp,
    # about one in 30 sits near an e4m3 midpoint (0.17% of one row's codes flipped on an H100)
    assert_same_codes(got, want, 1e-3 if dtype == torch.float32 else 5e-3, scale_rtol)
    assert_padding_is_zero(got)
    gate_up = torch.randn(rows, 2 * inter, device="cuda", dtype=dtype) * 2
    got = silu_and_mul_quantized(gate_up, fp8_cublas.activation_format(down_layout, rows, dtype))
    q, s = got.row_major()
    act = silu_and_mul(gate_up)  # the same SwiGLU values: the quantization alone differs, if anything
    want_q, want_s = triton_fp8.quantize_activation(act, down_layout)
    assert torch.equal(e4m3_codes(q), e4m3_codes(want_q)) and torch.equal(s, want_s)
    if dtype == torch.float32:
        # IEEE divisions in float32: the torch reference's codes and scales bit for bit
        want_q, want_s = quantize_activation(act, down_layout)
        assert torch.equal(e4m3_codes(q), e4m3_codes(want_q)) and torch.equal(s, want_s)
        # the engine's unfused float32 SwiGLU is torch's op (exp rounds otherwise)
        torch_op = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        assert_same_codes(got, quantize_activation(torch_op, down_layout), 1e-3, scale_rtol)


@pytest.mark.gpu
@pytest.mark.gpu_quick
def test_gpu_fused_producers_replay_in_a_cuda_graph_with_pdl():
    from nanoexp.kernels import pdl

    device = torch.device("cuda", torch.cuda.current_device())
    layout = Fp8Layout(512, 256, 0, 128)
    x, r = (
        torch.randn(4, 256, device=device, dtype=torch.bfloat16),
        torch.randn(4, 256, device=device).bfloat16(),
    )
    weight = torch.ones(256, device=device, dtype=torch.bfloat16)
    gate_up = torch.randn(4, 512, device=device, dtype=torch.bfloat16)
    fmt = ActivationFormat(layout, 4, False)
    pdl.configure("auto", device, True)
    try:
        with pdl.graph_launches():
            rms_norm_quantized(x, r, weight, EPS, fmt)  # compile outside the capture
            silu_and_mul_quantized(gate_up, fmt)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                normed, summed = rms_norm_quantized(x, r, weight, EPS, fmt)
                act = silu_and_mul_quantized(gate_up, fmt)
    finally:
        pdl.configure("off", device, True)
    for t in (x, r, gate_up):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    (want_q, want_s), want_sum = unfused_norm(x, r, weight, layout)
    assert torch.equal(summed, want_sum)
    assert_same_codes(normed, (want_q, want_s), 1e-2, ulp(torch.bfloat16))
    q, s = act.row_major()
    want_q, want_s = triton_fp8.quantize_activation(silu_and_mul(gate_up), layout)
    assert torch.equal(e4m3_codes(q), e4m3_codes(want_q)) and torch.equal(s, want_s)
