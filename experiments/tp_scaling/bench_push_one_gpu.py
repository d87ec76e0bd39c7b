"""The push all-reduce's own cost, two simulated ranks on one GPU (no NVLink in the path).

Both ranks' buffers live on one GPU and each rank's calls run on a stream of its own, captured
together in one CUDA graph of `--calls` calls per rank; the time per call is the replay's over
`--calls`. Beside it, the same graph with a plain copy (x -> out) in place of the all-reduce: the
graph's per-node cost, which any kernel pays. What the push adds over that copy is its own work
(tag, stores to both buffers, the spin, the sum, the clear), a lower bound for two GPUs, where
the peer's stores cross NVLink (~1 us more, `runs/all_reduce.md`'s one-shot at small sizes).

    python experiments/tp_scaling/bench_push_one_gpu.py [--rows 1,16,64,128,256] [--hidden 1024,4096]
"""

from __future__ import annotations

import argparse

import torch

from nanoexp.kernels import pdl
from nanoexp.kernels.base import num_sms
from nanoexp.kernels.triton_push_all_reduce import PushAllReduce, forked


def time_graph(launch, streams, calls: int, repeats: int = 20) -> float:
    """us per call: `launch(i)` enqueues call i on the current stream, captured per rank stream."""
    for _ in range(2):  # compile and warm outside the capture
        with forked(streams):
            for i in range(calls):
                launch(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), forked(streams):
        for i in range(calls):
            launch(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def bench(rows: int, hidden: int, calls: int) -> tuple[float, float]:
    device = torch.device("cuda")
    n = rows * hidden
    ranks = PushAllReduce.simulated(2, n, device, max_programs=num_sms(device) // 2)
    streams = [torch.cuda.Stream() for _ in ranks]
    xs = [torch.randn(n, device=device).to(torch.bfloat16) for _ in ranks]
    outs = [torch.empty_like(x) for x in xs]

    def push(i: int) -> None:
        for rank, stream, x, out in zip(ranks, streams, xs, outs):
            with torch.cuda.stream(stream):
                rank.launch(x, out)

    def copy(i: int) -> None:
        for stream, x, out in zip(streams, xs, outs):
            with torch.cuda.stream(stream):
                out.copy_(x)

    with pdl.graph_launches():
        push_us = time_graph(push, streams, calls)
    expected = (xs[0].float() + xs[1].float()).to(torch.bfloat16)
    assert all(torch.equal(out, expected) for out in outs) and sum(r.timeouts() for r in ranks) == 0
    return push_us, time_graph(copy, streams, calls)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,64,128,256")
    parser.add_argument("--hidden", default="1024,4096")
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--pdl", default="auto")
    args = parser.parse_args()
    pdl.configure(args.pdl, torch.device("cuda"), has_triton=True)
    print(f"{torch.cuda.get_device_name()}, two simulated ranks on one GPU, bf16, pdl {args.pdl}\n")
    print("| rows x hidden | KiB | push us per call | copy us per call | push - copy us |")
    print("|---|---:|---:|---:|---:|")
    for hidden in map(int, args.hidden.split(",")):
        for rows in map(int, args.rows.split(",")):
            push_us, copy_us = bench(rows, hidden, args.calls)
            kib = rows * hidden * 2 / 1024
            extra = push_us - copy_us
            print(f"| {rows} x {hidden} | {kib:g} | {push_us:.2f} | {copy_us:.2f} | {extra:.2f} |")


if __name__ == "__main__":
    main()
