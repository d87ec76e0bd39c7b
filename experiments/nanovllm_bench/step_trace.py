"""Where a decode step's time goes on the GPU: kernels, their order, and the idle gaps between them.

Runs Qwen3-0.6B (dummy bf16 weights) through the engine, `--batch` requests of `--input-len`
tokens decoding `--output-len` tokens each (plain sampling, as `workload=latency`), profiles a
second, warm run with the torch profiler, and splits the GPU timeline into decode steps at the
sampler's last kernel. Prints, for the median step: wall time, busy time (sum of kernel
durations), idle gaps, kernel count; the kernels per step by name; and the step's timeline.

    python experiments/nanovllm_bench/step_trace.py [--batch 1] [--kv-cache-dtype auto] [--out f.md]

With `--tp 2` the profiler runs inside worker rank 0 (started and stopped through the executor),
steps are split where each step's inputs are copied to the device, and the main process times
its own side of each step: the `launch` (pickle, ring write), the wait in `collect` for rank 0's
tokens, and the rest (scheduling, bookkeeping).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from nanoexp import LLM
from nanoexp.config import SamplingParams

STEP_END = "_pick_kernel"  # the one-pass sampler's last kernel ends every step


def kernel_events(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(kernels, key=lambda e: e["ts"])


def split_steps(kernels: list[dict]) -> list[list[dict]]:
    steps, current = [], []
    for k in kernels:
        current.append(k)
        if k["name"].startswith(STEP_END):
            steps.append(current)
            current = []
    return steps


def split_at_uploads(kernels: list[dict]) -> list[list[dict]]:
    """Steps begin with the host-to-device copy of their inputs (the first of a run of copies)."""
    steps, current, previous_copy = [], [], False
    for k in kernels:
        is_copy = k.get("cat") == "gpu_memcpy"
        if is_copy and not previous_copy and current:
            steps.append(current)
            current = []
        current.append(k)
        previous_copy = is_copy
    return steps + ([current] if current else [])


_worker_profile: list = []  # the profiler running inside a worker


def profiled_activities(cpu: bool) -> list:
    gpu = torch.cuda.is_available()
    return ([ProfilerActivity.CUDA] if gpu else []) + ([ProfilerActivity.CPU] if cpu or not gpu else [])


def start_worker_profile(runner, cpu: bool) -> None:
    prof = profile(activities=profiled_activities(cpu))
    prof.__enter__()
    _worker_profile.append(prof)


def stop_worker_profile(runner, cpu: bool):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof = _worker_profile.pop()
    prof.__exit__(None, None, None)
    table = host_table(prof) if cpu else ""
    return kernel_events(prof), table


def host_table(prof) -> str:
    averages = prof.key_averages()
    return averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=50)


class HostClock:
    """Wraps the executor's launch and collect to time the main process's side of each step."""

    def __init__(self, executor):
        self.launch_s, self.collect_s = [], []
        self.launch, self.collect = executor.launch, executor.collect
        executor.launch, executor.collect = self.timed_launch, self.timed_collect

    def timed_launch(self, step):
        t = time.perf_counter()
        self.launch(step)
        self.launch_s.append(time.perf_counter() - t)

    def timed_collect(self):
        t = time.perf_counter()
        out = self.collect()
        self.collect_s.append(time.perf_counter() - t)
        return out

    def summary(self, wall_s: float) -> list[str]:
        n = max(1, len(self.collect_s))
        launch, collect = sum(self.launch_s), sum(self.collect_s)
        rest = wall_s - launch - collect
        return [
            "",
            f"Main process, {n} collects in {wall_s * 1e3:.1f} ms ({wall_s / n * 1e6:.0f} us per step): "
            f"launch {launch / n * 1e6:.0f} us, waiting in collect {collect / n * 1e6:.0f} us, "
            f"the rest (scheduling, bookkeeping) {rest / n * 1e6:.0f} us per step; "
            f"median collect wait {statistics.median(self.collect_s) * 1e6:.0f} us, "
            f"median launch {statistics.median(self.launch_s or [0]) * 1e6:.0f} us",
        ]


def short(name: str) -> str:
    return name.split("(")[0].split("<")[0][:56]


def describe(step: list[dict]) -> dict:
    wall = step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]
    busy = sum(k["dur"] for k in step)
    return {"wall": wall, "busy": busy, "kernels": len(step)}


def report(steps: list[list[dict]], title: str) -> list[str]:
    decode = [s for s in steps if len(s) > 20][1:-1]  # drop the prefill's and the edges
    if not decode:
        return [f"## {title}", "", "no decode steps traced (CUDA kernels only)"]
    stats = [describe(s) for s in decode]
    walls = [s["wall"] for s in stats]
    ends = [s[-1]["ts"] + s[-1]["dur"] for s in decode]
    periods = [b - a for a, b in zip(ends, ends[1:])]
    median_step = decode[walls.index(sorted(walls)[len(walls) // 2])]
    med = describe(median_step)
    lines = [
        f"## {title}",
        "",
        f"{len(decode)} decode steps; median step: wall {med['wall']:.1f} us, kernels busy "
        f"{med['busy']:.1f} us, idle {med['wall'] - med['busy']:.1f} us, {med['kernels']} kernels; "
        f"wall over all steps: median {statistics.median(walls):.1f} us, min {min(walls):.1f}; "
        f"step period (end to end, host gaps included): median {statistics.median(periods):.1f} us",
        "",
        "| kernel | per step | mean us | total us per step |",
        "|---|---:|---:|---:|",
    ]
    per_name = collections.defaultdict(list)
    for k in median_step:
        per_name[short(k["name"])].append(k["dur"])
    for name, durs in sorted(per_name.items(), key=lambda t: -sum(t[1])):
        lines.append(f"| {name} | {len(durs)} | {statistics.mean(durs):.2f} | {sum(durs):.1f} |")
    lines += [
        "",
        "Timeline of the median step (first 24 and last 8 kernels): start offset, gap before, duration",
        "",
        "| # | kernel | start us | gap us | dur us |",
        "|---:|---|---:|---:|---:|",
    ]
    t0, prev_end = median_step[0]["ts"], median_step[0]["ts"]
    for i, k in enumerate(median_step):
        if i < 24 or i >= len(median_step) - 8:
            lines.append(
                f"| {i} | {short(k['name'])} | {k['ts'] - t0:.1f} | {k['ts'] - prev_end:.1f} | "
                f"{k['dur']:.2f} |"
            )
        prev_end = k["ts"] + k["dur"]
    return lines


def timed_generate(llm, prompts, params) -> float:
    clock_start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - clock_start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3_0_6b", help="a conf/model name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--pdl", default="auto")
    parser.add_argument("--cpu", action="store_true", help="also the host's ops, by self CPU time per step")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (profiles rank 0)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    arch = yaml.safe_load(open(f"conf/model/{args.model}.yaml"))["arch"]
    llm = LLM(
        args.model,
        hf_config=arch,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=4096,
        max_num_seqs=max(8, args.batch),
        kv_cache_dtype=args.kv_cache_dtype,
        pdl=args.pdl,
        tensor_parallel_size=args.tp,
    )
    prompts = [[(7 * i + j) % 10000 for j in range(args.input_len)] for i in range(args.batch)]
    params = SamplingParams(temperature=1.0, max_tokens=args.output_len, ignore_eos=True)
    for _ in range(3):
        llm.generate(prompts, params, use_tqdm=False)
    executor = llm.engine.executor
    clock = HostClock(executor)
    table = ""
    if args.tp == 1:
        with profile(activities=profiled_activities(args.cpu)) as prof:
            wall_s = timed_generate(llm, prompts, params)
            torch.cuda.synchronize()
        kernels, table = kernel_events(prof), (host_table(prof) if args.cpu else "")
        steps = split_steps(kernels)
    else:
        executor.call(start_worker_profile, args.cpu)
        wall_s = timed_generate(llm, prompts, params)
        kernels, table = executor.call(stop_worker_profile, args.cpu)
        steps = split_at_uploads(kernels)
    llm.close()
    title = (
        f"batch {args.batch}, input {args.input_len}, output {args.output_len}, "
        f"kv_cache_dtype {args.kv_cache_dtype}, pdl {args.pdl}, tp {args.tp}"
    )
    lines = report(steps, title) + clock.summary(wall_s)
    if table:
        where = "worker rank 0" if args.tp > 1 else "this process"
        heading = f"Host ops in {where} over the whole run ({args.output_len} steps), by self CPU time:"
        lines += ["", heading, "", table]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
