"""All-reduce latency on N GPUs of one host: NCCL (eager and in a CUDA graph), symmetric-memory
one-shot and two-shot (in a graph and eager), and `parallel.all_reduce=auto` as the runner sets it
up, for rows x hidden bf16 messages; each path's result checked against NCCL's sum; times against
the NVLink bytes floor.

    python experiments/tp_scaling/bench_all_reduce.py --world 2 --out runs/all_reduce.md

Graph timings replay a graph of --calls back-to-back all-reduces --replays times and report per call,
so launch cost is amortized as in a captured decode step. The floor is the bytes each GPU must move
over NVLink, 2 (N-1)/N x message (one-shot itself reads (N-1) x message from its peers), at the
bandwidth of a large peer-to-peer copy measured here (or --bw-gbps).
"""

from __future__ import annotations

import os

# NVLink multicast stays off in every process (set before torch.distributed is imported).
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(NO_MULTICAST_ENV)

import argparse  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from nanoexp.experiment.runtime import atomic_files  # noqa: E402
from nanoexp.kernels import all_reduce as ar_module  # noqa: E402
from nanoexp.kernels.all_reduce import AllReduce, setup_all_reduce  # noqa: E402

assert ar_module.NO_MULTICAST_ENV == NO_MULTICAST_ENV
assert all(os.environ.get(k) == v for k, v in NO_MULTICAST_ENV.items()), "NVLink multicast must stay off"

ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
HIDDEN = [4096, 1024]  # Qwen3-8B, Qwen3-0.6B
DTYPE = torch.bfloat16
PATHS = [
    "nccl_eager",
    "nccl_graph",
    "one_shot_graph",
    "one_shot_eager",
    "two_shot_graph",
    "two_shot_eager",
    "auto_graph",
]
NOMINAL_BW_GBPS = 450.0  # H200 NVLink4, 18 links x 25 GB/s per direction


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=ROWS)
    p.add_argument("--hidden", type=int, nargs="+", default=HIDDEN)
    p.add_argument("--calls", type=int, default=100, help="all-reduces per captured graph")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--eager-iters", type=int, default=200)
    p.add_argument(
        "--auto-rows",
        type=int,
        default=256,
        help="rows the runner's symmetric buffer holds for `auto` (max_num_seqs; default 256)",
    )
    p.add_argument("--bw-gbps", type=float, default=None, help="NVLink GB/s per direction; default: measured")
    p.add_argument("--out", type=Path, required=True, help="markdown file to write")
    return p.parse_args()


def measure_p2p_gbps(device: torch.device, peer: int, nbytes: int = 1 << 30) -> float:
    """GB/s of a large copy from a peer GPU's memory into this one (copy engines over NVLink)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", peer))
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    gbps = 5 * nbytes / (start.elapsed_time(end) * 1e-3) / 1e9
    del src, dst
    torch.cuda.synchronize(peer)
    return gbps


def path_fn(path: str, forced: AllReduce, auto: AllReduce):
    kind = path.rsplit("_", 1)[0]
    return {"nccl": forced.nccl, "one_shot": forced.one_shot, "two_shot": forced.two_shot, "auto": auto}[kind]


def time_eager(fn, x: torch.Tensor, iters: int) -> float:
    for _ in range(5):
        fn(x)
    start, end = sync_start()
    for _ in range(iters):
        fn(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def capture(fn, x: torch.Tensor, calls: int) -> torch.cuda.CUDAGraph:
    fn(x)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x)
    return graph


def time_graph(fn, x: torch.Tensor, calls: int, replays: int) -> float:
    graph = capture(fn, x, calls)
    graph.replay()
    start, end = sync_start()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def sync_start() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def max_error(fn, x: torch.Tensor) -> float:
    """Max abs difference from NCCL's sum, eagerly and replayed from a one-call graph."""
    expected = x.clone()
    dist.all_reduce(expected)
    eager = (fn(x.clone()).float() - expected.float()).abs().max()
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    fn(static.clone())
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        result = fn(static.clone())
    graph.replay()
    torch.cuda.synchronize()
    return float(max(eager, (result.float() - expected.float()).abs().max()))


def across_ranks_max(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def rank_main(rank: int, args: argparse.Namespace, init: str, out: str) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=args.world, device_id=device)
    try:
        bw = args.bw_gbps or (measure_p2p_gbps(device, 1) if rank == 0 else 0.0)
        dist.barrier()
        max_bytes = max(args.rows) * max(args.hidden) * DTYPE.itemsize
        forced = setup_all_reduce("symm_mem", None, device, DTYPE, max_bytes)
        results = []
        for hidden in args.hidden:
            auto = setup_all_reduce("auto", None, device, DTYPE, args.auto_rows * hidden * DTYPE.itemsize)
            for rows in args.rows:
                results.append(bench_size(rows, hidden, forced, auto, args, device))
        if rank == 0:
            with atomic_files.atomic_open(out, "wb") as f:
                torch.save(
                    {
                        "bw": bw,
                        "measured": args.bw_gbps is None,
                        "results": results,
                        "calls": args.calls,
                        "auto_rows": args.auto_rows,
                        "thresholds": auto.describe(),
                        "device": torch.cuda.get_device_name(device),
                    },
                    f,
                )
    finally:
        dist.destroy_process_group()


def bench_size(rows: int, hidden: int, forced: AllReduce, auto: AllReduce, args, device) -> dict:
    zeros = torch.zeros(rows, hidden, dtype=DTYPE, device=device)  # timing input: sums stay finite
    gen = torch.Generator(device).manual_seed(rows * 7919 + hidden + dist.get_rank())
    data = torch.randn(rows, hidden, generator=gen, dtype=DTYPE, device=device)
    times, errors = [], []
    for path in PATHS:
        fn = path_fn(path, forced, auto)
        if path.endswith("graph"):
            times.append(time_graph(fn, zeros, args.calls, args.replays))
        else:
            times.append(time_eager(fn, zeros, args.eager_iters))
        errors.append(max_error(fn, data))
    times, errors = across_ranks_max(times, device), across_ranks_max(errors, device)
    return {
        "rows": rows,
        "hidden": hidden,
        "times_us": dict(zip(PATHS, times)),
        "max_abs_error": max(errors),
        "auto_path": auto.path_for(zeros),
    }


def table(report: dict, world: int) -> str:
    bw = report["bw"]
    lines = [
        f"# All-reduce latency, {world} x {report['device']}, bf16, torch {torch.__version__}",
        "",
        f"NVLink bandwidth: {bw:.0f} GB/s per direction "
        + ("(measured: 1 GiB peer-to-peer copy)" if report["measured"] else "(given)")
        + f"; nominal H200 NVLink4 is {NOMINAL_BW_GBPS:.0f} GB/s. Floor = 2 (N-1)/N x message / bandwidth "
        "(one-shot alone reads (N-1) x message). "
        "Each cell: us per call (ratio to the floor). "
        f"Graphs: replays of {report['calls']} back-to-back calls. `auto`: as the runner sets it up, a "
        f"symmetric buffer of {report['auto_rows']} rows x hidden (max_num_seqs), NCCL above it, "
        f"one-shot up to {report['thresholds']['all_reduce_one_shot_max_bytes'] // 1024} KiB. "
        f"Multicast off: {', '.join(f'{k}={v}' for k, v in NO_MULTICAST_ENV.items())}.",
        "",
        "| rows | hidden | KiB | floor us | "
        + " | ".join(p.replace("_", " ") for p in PATHS)
        + " | auto took | max abs err vs NCCL |",
        "|" + "---:|" * (4 + len(PATHS)) + "---|---:|",
    ]
    for r in report["results"]:
        nbytes = r["rows"] * r["hidden"] * DTYPE.itemsize
        floor = 2 * (world - 1) / world * nbytes / (bw * 1e9) * 1e6
        cells = [f"{t:.1f} ({t / floor:.0f}x)" for t in r["times_us"].values()]
        lines.append(
            f"| {r['rows']} | {r['hidden']} | {nbytes / 1024:g} | {floor:.2f} | "
            + " | ".join(cells)
            + f" | {r['auto_path']} | {r['max_abs_error']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    if torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world {args.world} needs {args.world} GPUs; {torch.cuda.device_count()} visible")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.pt")
        mp.spawn(rank_main, args=(args, f"file://{tmp}/rendezvous", out), nprocs=args.world, join=True)
        report = torch.load(out)
    text = table(report, args.world)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_files.write_atomically(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
