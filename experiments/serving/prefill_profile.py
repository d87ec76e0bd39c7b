"""Where a small prefill step's time goes (GPU): step times by size, host phases, a profile.

Builds the engine as `python run.py model=qwen3_0_6b` does (dummy bf16 weights, defaults), then
times prefill steps of --sizes tokens, alone and beside --decodes running requests, from the
engine's own StepStats; times the host's phases of those steps; and profiles one step of each size
with the torch profiler (CPU and CUDA): the host ops by self time, the kernels' busy time, the
number of launches. Chrome traces go to --out.

    python experiments/serving/prefill_profile.py [--sizes 16,512,4096] [--decodes 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections import defaultdict

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from nanoexp import LLM, SamplingParams
from nanoexp.layers.sampler import Sampler
from nanoexp.runner import model_runner

PHASES: dict[str, float] = defaultdict(float)


def timed(owner, name: str, key: str) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            PHASES[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def prompt(n: int, salt: int) -> list[int]:
    return [(salt * 7919 + 31 * j) % 1000 for j in range(n)]


def prefill_step_times(llm: LLM, size: int, repeats: int, decodes: int, salt: int) -> list[float]:
    """StepStats.step_time_s of the prefill steps that admit one `size`-token request, with
    `decodes` long requests running beside it."""
    engine, times = llm.engine, []
    background = SamplingParams(max_tokens=3000, ignore_eos=True)
    for i in range(decodes):
        engine.add_request(prompt(256, salt + 1000 + i), background)
    while any(s.in_prefill for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    for r in range(repeats):
        engine.add_request(prompt(size, salt + r), SamplingParams(max_tokens=1, ignore_eos=True))
        for _ in range(8):
            _, stats = engine.step()
            if stats.phase == "prefill" or getattr(stats, "num_prefill_tokens", 0):
                times.append(stats.step_time_s)
                break
        engine.step()
    engine.abort_all()
    while engine.has_unfinished():
        engine.step()
    return times


def kernel_summary(prof) -> dict:
    path = "/tmp/_trace.json"
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"kernels": 0}
    busy = sum(e.get("dur", 0) for e in kernels)
    span = max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)
    return {"kernels": len(kernels), "busy_us": round(busy), "span_us": round(span)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,512,4096")
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--kwargs", default="{}", help="extra LLM kwargs as JSON")
    args = parser.parse_args()
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
    print(f"start-up {time.perf_counter() - start:.1f} s", flush=True)
    llm.generate([prompt(600, 1), prompt(40, 2)], SamplingParams(max_tokens=8), use_tqdm=False)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for decodes in (0, args.decodes):
        for size in sizes:
            times = prefill_step_times(llm, size, args.repeats, decodes, salt=size + decodes)
            med = statistics.median(times) * 1e3
            rows.append((decodes, size, med, min(times) * 1e3, max(times) * 1e3))
            print(
                f"prefill {size:5d} tokens beside {decodes:3d} decodes: median {med:.2f} ms "
                f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}; n={len(times)})",
                flush=True,
            )

    for owner, name, key in [
        (model_runner.ModelRunner, "prepare", "prepare (inputs upload)"),
        (model_runner.ModelRunner, "forward_hidden", "forward_hidden (model)"),
        (llm.engine.executor.runner.model, "compute_logits", "LM head"),
        (Sampler, "forward", "sampler"),
        (model_runner.ModelRunner, "run", "runner.run (all, incl. the wait)"),
    ]:
        timed(owner, name, key)
    for size in sizes:
        PHASES.clear()
        n = args.repeats
        prefill_step_times(llm, size, n, 0, salt=size + 77)
        print(
            f"host phases, prefill {size} alone (mean per step, ms): "
            + ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in PHASES.items()),
            flush=True,
        )

    for size in sizes:
        engine = llm.engine
        engine.add_request(prompt(size, 999 + size), SamplingParams(max_tokens=1, ignore_eos=True))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
        while engine.has_unfinished():
            engine.step()
        prof.export_chrome_trace(os.path.join(args.out, f"prefill_{size}.json"))
        print(f"\n=== profile: prefill {size} alone: {kernel_summary(prof)}")
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60
        )
        print(table)
    llm.close()


if __name__ == "__main__":
    main()
