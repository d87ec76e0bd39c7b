"""Qwen3-8B's linear layers in fp8 (the Triton kernels) against bf16 (cuBLAS) and against their floors:
bytes over the measured copy bandwidth, FLOPs over the dense fp8 rate. Each time is the median of CUDA-graph
replays of 20 back-to-back calls. Each row also checks the kernel's result against the torch reference, and
a few tile configurations are timed beside the default (decode GEMV at 1 row, skinny GEMM at 16, 4,096).
First, the producers that quantize an fp8 layer's input (add + RMSNorm, SwiGLU) against the unfused pair
(the op, then the quantization kernel), alone and followed by their layer's GEMM; `--fused` runs only that.
`--gemv` runs only the one-row table: the engine's kernel at each layer against GEMV configurations, among
them the candidate that sums its products once after the K loop (GemvConfig.deferred_sum), with each one's
error against the reference.

    python experiments/fp8/kernel_bench.py [--fused | --gemv]"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

from nanoexp.kernels import fp8_cublas, triton_fp8
from nanoexp.kernels.fp8_cublas import MIN_ROWS, blockwise_scaled_mm_works, cublas_fp8_linear
from nanoexp.kernels.fp8_reference import Fp8Layout, quantize_weight, w8a8_reference
from nanoexp.kernels.triton_fp8 import GemmConfig, GemvConfig, fp8_linear, fp8_matmul, quantize_activation
from nanoexp.kernels.triton_fp8_inputs import rms_norm_quantized, silu_and_mul_quantized
from nanoexp.kernels.triton_swiglu import silu_and_mul
from nanoexp.layers.compiled import use_compiled
from nanoexp.layers.norm import add_rms_norm

SHAPES = {
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (24576, 4096),
    "down_proj": (4096, 12288),
}
PAD_ROWS = 16  # one row padded to cuBLAS's row multiple (fp8_cublas.ROW_MULTIPLE)
CUBLAS = False  # cuBLAS's block-scaled fp8 GEMM passed its check here (set in main)
FP8_TFLOPS = 1580e12  # DESIGN.md: ~790 TFLOP/s bf16 dense measured, fp8 twice that
COLUMNS = (
    "layer|M|bf16 us|fp8 us (quant+GEMM)|fp8 GEMM only us|fp8 floor us|fp8/floor|fp8/bf16|rel err vs ref"
)
CANDIDATES = {
    1: [
        GemvConfig(4, 4),
        GemvConfig(8, 4),
        GemvConfig(8, 8),
        GemvConfig(16, 4, 8),
        GemvConfig(32, 2, 8),
        GemvConfig(16, 4, 4, split_k=4),
        GemvConfig(32, 4, 8, split_k=4),
        GemvConfig(8, 4, 4, split_k=2),
        GemmConfig(16, 32, 4, 4),  # the tensor-core kernel at one row (rows padded to 16)
        GemmConfig(16, 64, 4, 6),  # the engine's for layers of >= 6,144 rows (WIDE_ROW_GEMM)
        GemmConfig(16, 64, 4, 8),
        GemmConfig(16, 128, 4, 4),
        GemmConfig(16, 64, 4, 6, quantize_a=True),  # and no quantization launch before it
        GemvConfig(8, 4, deferred_sum=True),  # one reduction after the K loop, none per iteration
        GemvConfig(16, 2, 4, deferred_sum=True),
    ],
    4: [
        GemmConfig(16, 32, 4, 4),  # the engine's default at 2-64 rows
        GemmConfig(16, 64, 4, 6),
        GemmConfig(16, 64, 4, 6, quantize_a=True),
    ],
    16: [
        GemmConfig(16, 32, 4, 4),
        GemmConfig(16, 64, 4, 4),
        GemmConfig(16, 128, 4, 3),
        GemmConfig(16, 64, 4, 6),
        GemmConfig(16, 64, 4, 4, quantize_a=True),  # no quantization kernel: the GEMM quantizes x's tiles
    ],
    4096: [
        GemmConfig(128, 128, 8, 3),
        GemmConfig(128, 128, 8, 4),
        GemmConfig(128, 256, 8, 3),
        GemmConfig(64, 128, 4, 4),
        GemmConfig(128, 64, 4, 4),
        GemmConfig(128, 128, 8, 3, quantize_a=True),
        GemmConfig(128, 128, 8, 4, quantize_a=True),
    ],
}


def timed_us(fn, calls: int = 20, reps: int = 15) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def copy_bandwidth() -> float:
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = timed_us(lambda: b.copy_(a), calls=5, reps=5)
    return 2 * a.numel() / (us * 1e-6)


def main() -> None:
    torch.manual_seed(0)
    global CUBLAS
    CUBLAS = blockwise_scaled_mm_works(torch.device("cuda", torch.cuda.current_device()))
    bw = copy_bandwidth()
    print(
        f"device {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s; "
        f"cuBLAS block-scaled fp8 GEMM: {CUBLAS}"
    )
    if "--gemv" in sys.argv:
        gemv_table(bw)
        return
    fused_table(bw)
    if "--fused" in sys.argv:
        return
    print("| " + " | ".join(COLUMNS.split("|")) + " |")
    print("|---" * len(COLUMNS.split("|")) + "|")
    weights = {name: torch.randn(n, k, device="cuda") * 0.02 for name, (n, k) in SHAPES.items()}
    for name, w in weights.items():
        for m in (1, 2, 4, 8, 16, 64, 4096):
            print(row(name, w, m, bw))
    print("\nTile configurations (fp8 us, quantization included):")
    for m, configs in CANDIDATES.items():
        for name, w in weights.items():
            print(f"M={m} {name}: {tile_times(w, m, configs)}")


FUSED_COLUMNS = (
    "producer -> layer|M|unfused us|fused us|saved us|bytes floor us|+GEMM unfused us|+GEMM fused us"
)


def activation_format(layout: Fp8Layout, m: int):
    """The format the engine's bound GEMM reads (cuBLAS's M-major from 65 bf16 rows where it passed)."""
    module = fp8_cublas if CUBLAS else triton_fp8
    return module.activation_format(layout, m, torch.bfloat16)


def fused_table(bw: float) -> None:
    """add + RMSNorm before qkv_proj (gate_up_proj has the same producer, K = 4,096) and SwiGLU before
    down_proj at 1, 16 and 4,096 rows, unfused (the torch.compile'd norm of the CUDA graphs / the Triton
    SwiGLU, then the quantization kernel) against fused, alone and followed by the layer's GEMM."""
    print("\nProducers quantizing an fp8 layer's input, fused against unfused (bf16):")
    print("| " + " | ".join(FUSED_COLUMNS.split("|")) + " |")
    print("|---" * len(FUSED_COLUMNS.split("|")) + "|")
    for m in (1, 16, 4096):
        print(fused_row("add+RMSNorm -> qkv_proj", m, bw))
        print(fused_row("SwiGLU -> down_proj", m, bw))


def fused_row(name: str, m: int, bw: float) -> str:
    swiglu = name.startswith("SwiGLU")
    n, k = SHAPES["down_proj" if swiglu else "qkv_proj"]
    layout = Fp8Layout(n, k, 0, 128)
    q, s = quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
    fmt = activation_format(layout, m)
    gemm = cublas_fp8_linear if CUBLAS else fp8_linear
    if swiglu:
        gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
        unfused, fused = (lambda: silu_and_mul(gate_up)), (lambda: silu_and_mul_quantized(gate_up, fmt))
        moved = m * 3 * k * 2  # [gate | up] read, the bf16 output
    else:
        x, r = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        norm_w = torch.rand(k, device="cuda").bfloat16() + 0.5
        unfused = lambda: add_rms_norm(x, r, norm_w, 1e-6)[0]  # noqa: E731
        fused = lambda: rms_norm_quantized(x, r, norm_w, 1e-6, fmt)[0]  # noqa: E731
        moved = m * k * 2 * 3  # x and the residual read, their sum written
    floor = (moved + m * k * (1 + 4 / 128)) / bw * 1e6  # and the e4m3 values and scales written

    def unfused_pair():
        return quantize_activation(unfused(), layout, scales_m_major=fmt.m_major, rows=fmt.rows)

    with use_compiled(True):
        times = [
            timed_us(unfused_pair),
            timed_us(fused),
            timed_us(lambda: gemm(unfused(), q, s, layout)),
            timed_us(lambda: gemm(fused(), q, s, layout)),
        ]
    cells = [name, m, f"{times[0]:.1f}", f"{times[1]:.1f}", f"{times[0] - times[1]:.1f}", f"{floor:.1f}"]
    return "| " + " | ".join(map(str, [*cells, f"{times[2]:.1f}", f"{times[3]:.1f}"])) + " |"


# One row: the GEMV as the engine configures it (reductions across threads every iteration) and the
# candidate that accumulates w * x * scales elementwise over the K loop and reduces once at the end
GEMV_CANDIDATES = [
    GemvConfig(4, 4),
    GemvConfig(8, 4),
    GemvConfig(4, 4, deferred_sum=True),
    GemvConfig(8, 2, deferred_sum=True),
    GemvConfig(8, 4, deferred_sum=True),
    GemvConfig(16, 2, 4, deferred_sum=True),
    GemvConfig(16, 4, 8, deferred_sum=True),
    GemvConfig(8, 4, 4, split_k=2, deferred_sum=True),
    GemvConfig(4, 4, 4, split_k=4, deferred_sum=True),
]


def describe(config: GemvConfig) -> str:
    split = f" split {config.split_k}" if config.split_k > 1 else ""
    kind = "once" if config.deferred_sum else "per-iter"
    return f"{kind} {config.block_n}x{config.kb_tile}/{config.num_warps}w{split}"


def gemv_table(bw: float) -> None:
    """Each layer at one bf16 row (quantization included, as the engine runs it): the engine's kernel,
    then every GEMV candidate's time and its relative error against the torch reference in float32."""
    print("\nOne row, GEMV candidates (us, quantization included; [max rel err vs the reference, float32]):")
    print(
        "| layer | bytes floor us | engine us | best | bf16 cuBLAS us | cuBLAS fp8, 16-row pad "
        + "| its GEMM alone | "
        + " | ".join(map(describe, GEMV_CANDIDATES))
        + " |"
    )
    print("|---" * (7 + len(GEMV_CANDIDATES)) + "|")
    for name in SHAPES:
        print(gemv_row(name, bw))


def gemv_row(name: str, bw: float) -> str:
    (n, k), layout = SHAPES[name], Fp8Layout(*SHAPES[name], 0, 128)
    q, s = quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = w8a8_reference(x.float(), q, s, layout)  # errors in float32: bf16's output rounding hides them
    floor = (n * k + (n // 128) * (k // 128) * 4 + k * 2 + n * 2) / bw * 1e6  # weights, scales, x, y
    cells = []
    for config in GEMV_CANDIDATES:
        err = (fp8_linear(x.float(), q, s, layout, config=config) - ref).abs().max() / ref.abs().max()
        cells.append((timed_us(lambda c=config: fp8_linear(x, q, s, layout, config=c)), err.item()))
    engine = timed_us(lambda: fp8_linear(x, q, s, layout))
    best = min(range(len(cells)), key=lambda i: cells[i][0])
    row = [name, f"{floor:.1f}", f"{engine:.1f}", describe(GEMV_CANDIDATES[best])]
    row += cublas_one_row_cells(x, q, s, layout, ref)
    return "| " + " | ".join(row + [f"{t:.1f} ({e:.0e})" for t, e in cells]) + " |"


def cublas_one_row_cells(x, q, s, layout: Fp8Layout, ref: torch.Tensor) -> list[str]:
    """bf16 cuBLAS at one row (the streaming rate to match), then cuBLAS's block-scaled fp8 GEMM on the
    row padded to PAD_ROWS rows: with its quantization launch, and alone (as after a producer that emits
    the padded M-major format)."""
    w16 = q.to(torch.bfloat16)  # a bf16 weight of the layer's shape (its values do not change the time)
    cells = [f"{timed_us(lambda: F.linear(x, w16)):.1f}"]
    if not CUBLAS:
        return cells + ["n/a", "n/a"]

    def quantized():
        return quantize_activation(x, layout, scales_m_major=True, rows=PAD_ROWS)

    xq, xs = quantized()
    try:
        got = fp8_cublas.scaled_mm(xq, q, xs, s, torch.bfloat16)[:1].float()
    except RuntimeError as exc:  # cuBLAS refused the shape
        return cells + [f"refused ({str(exc)[:40]})", ""]
    err = ((got - ref).abs().max() / ref.abs().max()).item()

    def quantize_and_multiply():
        row_q, row_s = quantized()
        return fp8_cublas.scaled_mm(row_q, q, row_s, s, torch.bfloat16)

    with_quant = timed_us(quantize_and_multiply)
    alone = timed_us(lambda: fp8_cublas.scaled_mm(xq, q, xs, s, torch.bfloat16))
    return cells + [f"{with_quant:.1f} ({err:.0e})", f"{alone:.1f}"]


def tile_times(w: torch.Tensor, m: int, configs: list) -> str:
    layout = Fp8Layout(*w.shape, 0, 128)
    q, s = quantize_weight(w)
    x = torch.randn(m, w.shape[1], device="cuda", dtype=torch.bfloat16)
    times = {c: timed_us(lambda c=c: fp8_linear(x, q, s, layout, config=c)) for c in configs}
    if m >= MIN_ROWS and CUBLAS:
        times["cublas"] = timed_us(lambda: cublas_fp8_linear(x, q, s, layout))
    best = min(times, key=times.get)
    return f"best {best} {times[best]:.1f} us | " + ", ".join(f"{c}: {t:.1f}" for c, t in times.items())


def row(name: str, w: torch.Tensor, m: int, bw: float) -> str:
    """One shape's times, floor and error, as a markdown table row."""
    (n, k), layout = w.shape, Fp8Layout(*w.shape, 0, 128)
    q, s = quantize_weight(w)
    w16 = w.bfloat16()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quantize_activation(x, layout)
    t16 = timed_us(lambda: F.linear(x, w16))
    t8 = timed_us(lambda: fp8_linear(x, q, s, layout))
    if m >= MIN_ROWS and CUBLAS:  # the engine's prefill path under gemm_backend=auto
        t8 = min(t8, timed_us(lambda: cublas_fp8_linear(x, q, s, layout)))
    tg = timed_us(lambda: fp8_matmul(xq, xs, q, s, layout, torch.bfloat16))
    bytes_ = n * k + (n // 128) * (k // 128) * 4 + m * k * 3 + m * n * 2  # weights, scales, x, x quantized, y
    floor = max(bytes_ / bw, 2 * m * n * k / FP8_TFLOPS) * 1e6
    ref = w8a8_reference(x[:64], q, s, layout).float()
    err = (fp8_linear(x[:64], q, s, layout).float() - ref).abs().max().item() / ref.abs().max().item()
    cells = [name, m, f"{t16:.1f}", f"{t8:.1f}", f"{tg:.1f}", f"{floor:.1f}", f"{t8 / floor:.2f}"]
    return "| " + " | ".join(map(str, [*cells, f"{t8 / t16:.2f}", f"{err:.1e}"])) + " |"


if __name__ == "__main__":
    main()
