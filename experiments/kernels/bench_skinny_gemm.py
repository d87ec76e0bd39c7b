"""Decode-sized GEMMs on one GPU: cuBLAS (torch F.linear) against the Triton skinny GEMM.

For Qwen3 layer shapes (0.6B at TP=1, 8B at TP=1 and TP=2) and 1-256 rows, times each candidate
inside a CUDA graph of back-to-back calls that cycle through enough weight copies (> 2x L2) that
every call reads its weight from HBM, as in a decode step. Prints one markdown table: cuBLAS, the
kernel's default config, the best config found, the GEMV up to its row limit, and the floor: the
larger of the bytes at --bandwidth and the FLOPs at --tflops.

    python experiments/kernels/bench_skinny_gemm.py [--out f.md] [--sweep [gemv]] [--only 8B,0.6B] [--rows 1]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from nanoexp.experiment.runtime import atomic_files
from nanoexp.kernels import pdl
from nanoexp.kernels.base import NormFirst
from nanoexp.kernels.triton_gemm import TICKETS, GemmConfig, default_config, skinny_gemm
from nanoexp.kernels.triton_gemv import MAX_ROWS as GEMV_MAX_ROWS
from nanoexp.kernels.triton_gemv import GemvConfig, default_gemv_config
from nanoexp.layers.activation import silu_and_mul
from nanoexp.layers.compiled import use_compiled
from nanoexp.layers.norm import add_rms_norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import time_graph_us  # noqa: E402

SHAPES = {  # name: (N, K); "+silu": w is [gate; up] with 2N rows, against cuBLAS + compiled SwiGLU;
    # "norm+": RMSNorm(x + residual) first, against the compiled add + RMSNorm and cuBLAS
    "0.6B qkv": (4096, 1024),
    "0.6B norm+qkv": (4096, 1024),
    "0.6B norm+gate_up+silu": (3072, 1024),
    "0.6B gate_up+silu": (3072, 1024),
    "8B gate_up+silu tp2": (6144, 4096),
    "0.6B o": (1024, 2048),
    "0.6B gate_up": (6144, 1024),
    "0.6B down": (1024, 3072),
    "8B qkv tp1": (6144, 4096),
    "8B o tp1": (4096, 4096),
    "8B gate_up tp1": (24576, 4096),
    "8B down tp1": (4096, 12288),
    "8B qkv tp2": (3072, 4096),
    "8B o tp2": (4096, 2048),
    "8B gate_up tp2": (12288, 4096),
    "8B down tp2": (4096, 6144),
    "8B norm+qkv tp1": (6144, 4096),
    "8B norm+gate_up+silu tp1": (12288, 4096),
    "8B norm+qkv tp2": (3072, 4096),
    "8B norm+gate_up+silu tp2": (6144, 4096),
    "0.6B norm+qkv tp2": (2048, 1024),
    "0.6B o tp2": (1024, 1024),
    "0.6B norm+gate_up+silu tp2": (1536, 1024),
    # Qwen3-30B-A3B's attention projections (above the skinny GEMM's weight limit: cuBLAS in the engine)
    "30B-A3B qkv": (5120, 2048),
    "30B-A3B norm+qkv": (5120, 2048),
    "30B-A3B o": (2048, 4096),
    "1.7B o": (2048, 2048),
    "1.7B down": (2048, 6144),
    "1.7B norm+qkv": (4096, 2048),
    "0.6B down tp2": (1024, 1536),
    "0.6B lm_head": (151936, 1024),
    "8B lm_head": (151936, 4096),
}
ROWS = [1, 4, 16, 32, 64]
L2_BYTES = 60 * 2**20


# Row x column tiles and warps above 64 rows that compile for sm_90 without spills (compiled with
# experiments/tools/offline_sass.py, K steps of 64): plain and gated products, and with the norm in the K loop
WIDE_TILES = [
    (64, 64, 4),
    (64, 64, 8),
    (64, 128, 4),
    (64, 128, 8),
    (64, 256, 8),
    (128, 64, 4),
    (128, 64, 8),
    (128, 128, 8),
    (128, 256, 8),
]
WIDE_GATED_TILES = [
    (64, 64, 4),
    (64, 64, 8),
    (64, 128, 4),
    (64, 128, 8),
    (64, 256, 8),
    (128, 64, 4),
    (128, 64, 8),
    (128, 128, 8),
]
WIDE_NORM_TILES = [(64, 64, 8), (64, 128, 8), (128, 64, 8), (128, 128, 8)]


def sweep_configs(rows: int, n: int = 4096, gated: bool = False, normed: bool = False) -> list[GemmConfig]:
    """Skinny tiles below 64 rows; from 64, row tiles of 64-128 rows and 64-256 columns in K steps of 64,
    split 1-2 ways (4 for N <= 1,024; never with the norm in the loop), 3 stages (also 4 for 128 x 128)."""
    if rows < 64:
        return [
            GemmConfig(n, k, s, w, st)
            for n, k, s, w, st in itertools.product((16, 32, 64), (128, 256), (1, 2, 4, 8), (4,), (3, 4))
        ]
    tiles = WIDE_NORM_TILES if normed else WIDE_GATED_TILES if gated else WIDE_TILES
    splits = (1,) if normed else (1, 2, 4) if n <= 1024 else (1, 2)
    configs = []
    for (m, bn, w), s in itertools.product(tiles, splits):
        configs += [GemmConfig(bn, 64, s, w, st, m) for st in ((3, 4) if (m, bn) == (128, 128) else (3,))]
    return configs


def gemv_configs(n: int, k: int) -> list[GemvConfig]:
    """Tiles and warps. A split K needs a ticket per output tile, so split configs with more tiles
    than tickets are left out."""
    shapes = itertools.product((2, 4, 8, 16, 32), (256, 512, 1024), (4, 8))
    configs = [GemvConfig(bn, kt, w) for bn, kt, w in shapes]
    return [c for c in configs if c.k_tile >= k or -(-n // c.block_n) <= TICKETS]


ALL_TIMINGS: list[dict] = []  # every config timed, for --all-out


def best_of(configs, run, label: str = "") -> tuple[float, object]:
    timed = []
    for c in configs:
        try:
            timed.append((run(c), c))
        except OutOfResources:
            continue
        ALL_TIMINGS.append({"case": label, "config": describe(c), "us": round(timed[-1][0], 3)})
    return min(timed, key=lambda t: t[0])


def bench_shape(
    n: int, k: int, rows: int, gated: bool, normed: bool, sweep: str | None, label: str = ""
) -> dict:
    w_rows = 2 * n if gated else n
    copies = max(4, -(-2 * L2_BYTES // (w_rows * k * 2)))
    weights = [torch.randn(w_rows, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    x, residual = (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    norm = NormFirst(torch.ones(k, device="cuda", dtype=torch.bfloat16), 1e-6, residual) if normed else None

    def torch_op(w):
        inp = add_rms_norm(x, residual, norm.weight, norm.eps)[0] if normed else x
        return silu_and_mul(F.linear(inp, w)) if gated else F.linear(inp, w)

    def triton_op(w, config):
        out = skinny_gemm(x, w, None, config, gated=gated, norm=norm)
        return out[0] if normed else out

    with use_compiled(True):
        ref = torch_op(weights[0]).float()
        result = {"cublas": time_graph_us([lambda w=w: torch_op(w) for w in weights])}
    default = default_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count, rows)
    result["max_err"] = (triton_op(weights[0], default).float() - ref).abs().max().item()
    result["default"] = time_graph_us([lambda w=w: triton_op(w, default) for w in weights])
    result["default_cfg"] = default

    def timed(c):
        return time_graph_us([lambda w=w, c=c: triton_op(w, c) for w in weights])

    if rows <= GEMV_MAX_ROWS:
        gemv = default_gemv_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
        result["gemv_err"] = (triton_op(weights[0], gemv).float() - ref).abs().max().item()
        result["gemv"], result["gemv_cfg"] = timed(gemv), gemv
    if sweep == "all":
        result["best"], result["best_cfg"] = best_of(sweep_configs(rows, n, gated, normed), timed, label)
    if sweep and rows <= GEMV_MAX_ROWS:
        result["gemv_best"], result["gemv_best_cfg"] = best_of(gemv_configs(n, k), timed, label)
    return result


def describe(c: GemmConfig | GemvConfig) -> str:
    if isinstance(c, GemvConfig):
        return f"{c.block_n}/{c.k_tile}/w{c.num_warps}"
    rows = f"m{c.block_m}/" if c.block_m else ""
    return f"{rows}{c.block_n}/{c.block_k}/{c.split_k}/{c.num_stages}/w{c.num_warps}"


def timing(r: dict, key: str) -> str:
    return f"{r[key]:.2f} ({describe(r[key + '_cfg'])})" if key in r else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bandwidth", type=float, default=4.2e12)
    parser.add_argument("--tflops", type=float, default=780.0, help="dense bf16 ceiling, TFLOP/s")
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        choices=["all", "gemv"],
        default=None,
        help="also search block and split sizes (of the GEMV only: gemv)",
    )
    parser.add_argument("--pdl", action="store_true", help="Triton kernels with PDL, as in the engine graphs")
    parser.add_argument("--out", default=None)
    parser.add_argument("--all-out", default=None, help="every timed config, one JSON per line")
    parser.add_argument("--only", default="", help="shapes whose name contains one of these, comma-separated")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = parser.parse_args()
    if args.pdl:
        pdl.configure("on", torch.device("cuda"), has_triton=True)
    with pdl.graph_launches() if args.pdl else contextlib.nullcontext():
        table = bench(args)
    if args.out:
        with atomic_files.atomic_open(args.out) as f:
            legend = "config = [m block_m/]block_n/block_k/split_k/stages/warps; GEMV: block_n/k_tile/warps"
            f.write(f"{legend}; PDL {'on' if args.pdl else 'off'}\n\n{table}\n")


def bench(args: argparse.Namespace) -> str:
    lines = [
        "| shape | N x K | rows | cuBLAS us | Triton us (config) | best us (config) | GEMV us (config) | "
        "best GEMV us (config) | floor us | err | GEMV err |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (n, k) in SHAPES.items():
        if not any(part in name for part in args.only.split(",")):
            continue
        for rows in map(int, args.rows.split(",")):
            gated = "+silu" in name
            r = bench_shape(n, k, rows, gated, "norm+" in name, args.sweep, f"{name}/{rows}")
            ALL_TIMINGS.append({"case": f"{name}/{rows}", "config": "cublas", "us": round(r["cublas"], 3)})
            width = 2 * n if gated else n
            bytes_s = (width * k + rows * (n + k)) * 2 / args.bandwidth
            floor = max(bytes_s, 2 * rows * width * k / (args.tflops * 1e12)) * 1e6
            gemv_err = f"{r['gemv_err']:.3g}" if "gemv_err" in r else "-"
            lines.append(
                f"| {name} | {n}x{k} | {rows} | {r['cublas']:.2f} | {timing(r, 'default')} | "
                f"{timing(r, 'best')} | {timing(r, 'gemv')} | {timing(r, 'gemv_best')} | {floor:.2f} | "
                f"{r['max_err']:.3g} | {gemv_err} |"
            )
            print(lines[-1], flush=True)
            if args.all_out:  # rewritten after every row, so a cut run keeps what it timed
                with atomic_files.atomic_open(args.all_out) as f:
                    f.writelines(json.dumps(t) + "\n" for t in ALL_TIMINGS)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
