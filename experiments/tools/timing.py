"""GPU timing for the studies' scripts: a callable's median time with CUDA events, the per-call
time of callables replayed back to back from one CUDA graph (no launch gaps), and a table printer."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable

import torch

from nanoexp.experiment.runtime import atomic_files


def time_ms(fn: Callable[[], object], repeats: int = 30, warmup: int = 3) -> float:
    """Median of `repeats` timed calls (after `warmup` untimed ones), in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph_us(fns: list[Callable[[], object]], rounds: int = 6) -> float:
    """Median over `rounds` replays (after one untimed) of a graph of all fns, per call in us."""
    for fn in fns:
        fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    times = []
    for _ in range(rounds + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    timed = sorted(times[1:])
    return timed[len(timed) // 2]


def stream_table(header: list[str], rows: Iterable[str], out: str | None) -> None:
    """Print a markdown table's header, then each row as it is measured (freeing the GPU memory of
    the row before the next); with `out`, also write the whole table there."""
    lines = list(header)
    print("\n".join(lines), flush=True)
    for row in rows:
        lines.append(row)
        print(row, flush=True)
        torch.cuda.empty_cache()
    if out:
        atomic_files.write_atomically(out, "\n".join(lines) + "\n")


def add_timer(owner, name: str, totals: dict[str, float], key: str) -> None:
    """Wraps owner.name (a function of a module, or a method of a class) so that each call adds its
    wall time to totals[key]."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)
