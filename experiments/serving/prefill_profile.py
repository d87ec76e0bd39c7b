"""Where a prefill step's time goes (GPU): step times by size, host phases, a profile.

Builds the engine as `python run.py model=qwen3_0_6b` does (dummy bf16 weights, defaults; the time
of each captured graph size is printed), then times prefill steps of --sizes (`512` one prompt,
`8x512` eight in one step), alone and beside --decodes running requests, from the engine's own
StepStats; times the host's phases of those steps; and profiles one step of each size with the
torch profiler (CPU and CUDA): the kernels' busy time and launches, the kernels by GPU time, the
host ops by self time. Chrome traces go to --out.

    python experiments/serving/prefill_profile.py [--sizes 16,512,4096,8x512] [--decodes 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from nanoexp import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import add_timer  # noqa: E402

from nanoexp.engine import llm_engine
from nanoexp.experiment.runtime import atomic_files
from nanoexp.layers.sampler import Sampler
from nanoexp.runner import cuda_graphs, model_runner

PHASES: dict[str, float] = defaultdict(float)


CAPTURES: list[tuple[int, float, str]] = []
TRITON_CACHE = os.path.expanduser(os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache"))


def compiled_kernels() -> set[str]:
    """The Triton kernels compiled so far (Triton's cache: one folder per variant)."""
    return set(glob.glob(os.path.join(TRITON_CACHE, "*", "*.json"))) - set(
        glob.glob(os.path.join(TRITON_CACHE, "*", "__grp__*.json"))
    )


def new_kernel_names(before: set[str]) -> str:
    names = sorted(os.path.basename(p).removesuffix(".json") for p in compiled_kernels() - before)
    return ",".join(f"{n}x{names.count(n)}" if names.count(n) > 1 else n for n in dict.fromkeys(names))


def timed_capture_ladder(model, sizes, view, output, pool=None):
    """cuda_graphs.capture_ladder, one size at a time, timing each (warm-up run and capture)."""
    graphs = {}
    for size in reversed(sizes):
        torch.cuda.synchronize()
        start, before = time.perf_counter(), compiled_kernels()
        graphs.update(ORIGINAL_CAPTURE(model, [size], view, output, pool))
        pool = pool or graphs[size].pool()
        CAPTURES.append((size, time.perf_counter() - start, new_kernel_names(before)))
    return graphs


ORIGINAL_CAPTURE = cuda_graphs.capture_ladder
cuda_graphs.capture_ladder = timed_capture_ladder


def traced_start_up(name: str) -> None:
    """Prints the time of a start-up method of the runner and the Triton kernels it compiled."""
    inner = getattr(model_runner.ModelRunner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start, before = time.perf_counter(), compiled_kernels()
        try:
            return inner(*args, **kwargs)
        finally:
            compiled = new_kernel_names(before)
            print(f"{name}: {time.perf_counter() - start:.2f} s, compiled: {compiled}", flush=True)

    setattr(model_runner.ModelRunner, name, wrapper)


for _name in ("profile_memory", "warm_up_prefill_kernels", "warm_up_sampler"):
    traced_start_up(_name)


def prompt(n: int, salt: int) -> list[int]:
    return [(salt * 7919 + 31 * j) % 1000 for j in range(n)]


def prompt_sizes(size: str) -> list[int]:
    """`512` -> [512]; `8x512` -> eight prompts of 512 tokens, admitted in one step."""
    count, _, length = size.rpartition("x")
    return [int(length)] * int(count or 1)


def prefill_step_times(
    llm: LLM, size: str, repeats: int, decodes: int, salt: int, output_len: int = 1
) -> list[float]:
    """StepStats.step_time_s of the prefill steps that admit the `size` requests (of `output_len`
    tokens each: beyond 1 their next step is enqueued before the prefill's tokens are read back, as
    in an online job), with `decodes` long requests running beside them."""
    engine, times = llm.engine, []
    background = SamplingParams(max_tokens=3000, ignore_eos=True)
    for i in range(decodes):
        engine.add_request(prompt(256, salt + 1000 + i), background)
    while any(s.in_prefill for s in engine.scheduler.running_seqs()) or engine.scheduler.num_waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    for r in range(repeats):
        for i, length in enumerate(prompt_sizes(size)):
            params = SamplingParams(max_tokens=output_len, ignore_eos=True)
            engine.add_request(prompt(length, salt + 100 * r + i), params)
        for _ in range(8):
            _, stats = engine.step()
            if stats.phase == "prefill" or getattr(stats, "num_prefill_tokens", 0):
                times.append(stats.step_time_s)
                break
        while engine.has_unfinished() and not decodes:
            engine.step()
        engine.step()
    engine.abort_all()
    while engine.has_unfinished():
        engine.step()
    return times


def gpu_events(trace_path: str) -> list[dict]:
    events = json.load(open(trace_path))["traceEvents"]
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def kernel_summary(kernels: list[dict]) -> dict:
    if not kernels:
        return {"kernels": 0}
    busy = sum(e.get("dur", 0) for e in kernels)
    span = max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)
    return {"kernels": len(kernels), "busy_us": round(busy), "span_us": round(span)}


def kernels_by_time(kernels: list[dict], limit: int = 16) -> str:
    """The kernels of a profile grouped by name: launches, total and mean GPU time."""
    groups: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        groups[e["name"][:90]].append(e.get("dur", 0))
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:limit]
    lines = [f"  {sum(d):9.0f} us  {len(d):4d} x {sum(d) / len(d):7.1f} us  {name}" for name, d in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,512,4096,8x512")
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--kwargs", default="{}", help="extra LLM kwargs as JSON")
    parser.add_argument("--output-len", type=int, default=1, help="of the prompts timed alone")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    arch = yaml.safe_load(open("conf/model/qwen3_0_6b.yaml"))["arch"]
    start = time.perf_counter()
    llm = LLM(
        "qwen3_0_6b",
        hf_config=arch,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=8192,
        **json.loads(args.kwargs),
    )
    print(
        f"start-up {time.perf_counter() - start:.1f} s; stats: "
        + ", ".join(f"{k} {v:.1f}" for k, v in llm.stats().items() if k.endswith("_s")),
        flush=True,
    )
    for size, seconds, compiled in CAPTURES:
        print(f"graph capture {size:5d}: {seconds:.2f} s, compiled: {compiled}", flush=True)
    llm.generate([prompt(600, 1), prompt(40, 2)], SamplingParams(max_tokens=8), use_tqdm=False)
    sizes = args.sizes.split(",")
    rows = []
    for decodes in (0, args.decodes):
        for size in sizes:
            salt = sum(prompt_sizes(size)) + decodes
            output_len = 1 if decodes else args.output_len
            times = prefill_step_times(llm, size, args.repeats, decodes, salt, output_len)
            med = statistics.median(times) * 1e3
            rows.append((decodes, size, med, min(times) * 1e3, max(times) * 1e3))
            print(
                f"prefill {size:>6} tokens beside {decodes:3d} decodes: median {med:.2f} ms "
                f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}; n={len(times)})",
                flush=True,
            )

    for owner, name, key in [
        (model_runner.ModelRunner, "prepare", "prepare (inputs upload)"),
        (model_runner.ModelRunner, "forward_hidden", "forward_hidden (model)"),
        (llm.engine.executor.runner.model, "compute_logits", "LM head"),
        (Sampler, "forward", "sampler"),
        (model_runner.ModelRunner, "launch", "runner.launch (all of the enqueue)"),
        (model_runner.ModelRunner, "collect", "runner.collect (the wait)"),
        (llm_engine.Scheduler, "schedule", "schedule"),
        (llm_engine.LLMEngine, "complete", "complete"),
    ]:
        add_timer(owner, name, PHASES, key)
    for size in sizes:
        PHASES.clear()
        n = args.repeats
        prefill_step_times(llm, size, n, 0, sum(prompt_sizes(size)) + 77, args.output_len)
        print(
            f"host phases, prefill {size} alone, {args.output_len} output tokens (mean per prompt, ms): "
            + ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in PHASES.items()),
            flush=True,
        )

    for size in sizes:
        engine = llm.engine
        for i, length in enumerate(prompt_sizes(size)):
            engine.add_request(prompt(length, 999 + i), SamplingParams(max_tokens=1, ignore_eos=True))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
        while engine.has_unfinished():
            engine.step()
        path = os.path.join(args.out, f"prefill_{size}.json")
        atomic_files.write_by_name(path, prof.export_chrome_trace)
        kernels = gpu_events(path)
        print(f"\n=== profile: prefill {size} alone: {kernel_summary(kernels)}")
        print(kernels_by_time(kernels))
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60
        )
        print(table)
    llm.close()


if __name__ == "__main__":
    main()
