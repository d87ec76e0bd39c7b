"""Host cost of each piece of a lone prefill step's input upload and graph replay (GPU).

Builds the engine as prefill_profile.py does, records the StepInput of a lone prefill of each size,
then times each piece of the runner's path for it on the host (perf_counter, the device idle
before each repeat, median of --repeats): the numpy columns, the pinned staging buffer, its fill,
the host-to-device copy, the views, the step graph's input copies, the graph launch, the LM head
and the sampler; and, to calibrate, one tiny device op, one device copy and one copy from a kept
pinned buffer.

    python experiments/tools/upload_probe.py [--sizes 16,512,8x512] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from nanoexp import LLM, SamplingParams
from nanoexp.runner import inputs as runner_inputs
from nanoexp.runner.model_runner import ModelRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from prefill_profile import prompt, prompt_sizes  # noqa: E402

STEPS = []
_launch = ModelRunner.launch


def recording_launch(self, step):
    STEPS.append(step)
    return _launch(self, step)


ModelRunner.launch = recording_launch


def timed(fn, repeats: int) -> float:
    """Median host microseconds of fn(), the device idle before each call."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def pieces(runner: ModelRunner, step, repeats: int) -> dict[str, float]:
    device, graphs = runner.device, runner.step_graphs
    tile_m = graphs.tile_block_m if runner.uses_step_graph(step) else None
    vocab = runner.hf_config.vocab_size
    columns_of = lambda: (
        runner_inputs.input_columns(step, runner.block_size, tile_m)[0]
        + (  # noqa: E731
            runner_inputs.sampling_columns(step, vocab)[0]
        )
    )
    columns = columns_of()
    arrays = [np.ascontiguousarray(d, dtype=runner_inputs.NUMPY_DTYPES[t]) for d, t in columns]
    nbytes = sum(-(-a.nbytes // 64) * 64 for a in arrays)
    staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    kept = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def fill():
        flat, start = staging.numpy(), 0
        for a in arrays:
            flat[start : start + a.nbytes] = a.reshape(-1).view(np.uint8)
            start += -(-a.nbytes // 64) * 64

    packed = staging.to(device)

    def views():
        typed = {t: packed.view(t) for t in {t for _, t in columns}}
        return [typed[t][:4] for _, t in columns]

    model_inputs, sampling = runner.prepare(step)
    graph = graphs.graphs[graphs.size_for(step.num_tokens), step.num_decodes > 0]
    replay, graphs_replay = graphs.replay, type(graph).replay
    tiny = torch.zeros(4, device=device)
    hidden = graphs.replay(model_inputs)
    last = hidden[model_inputs.logits_indices]
    logits = runner.model.compute_logits(last)

    def copies_only():
        type(graph).replay = lambda self: None
        try:
            replay(model_inputs)
        finally:
            type(graph).replay = graphs_replay

    return {
        "input_columns+sampling_columns (numpy)": timed(columns_of, repeats),
        "arrays (np.ascontiguousarray)": timed(
            lambda: [np.ascontiguousarray(d, dtype=runner_inputs.NUMPY_DTYPES[t]) for d, t in columns],
            repeats,
        ),
        "torch.empty(pin_memory=True)": timed(
            lambda: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), repeats
        ),
        "fill staging": timed(fill, repeats),
        "staging.to(device, non_blocking)": timed(lambda: staging.to(device, non_blocking=True), repeats),
        "kept pinned -> kept device copy_": timed(lambda: dev.copy_(kept, non_blocking=True), repeats),
        "views": timed(views, repeats),
        "whole runner.prepare": timed(lambda: runner.prepare(step), repeats),
        "step graph input copies": timed(copies_only, repeats),
        "graph.replay()": timed(graph.replay, repeats),
        "hidden[logits_indices]": timed(lambda: hidden[model_inputs.logits_indices], repeats),
        "LM head": timed(lambda: runner.model.compute_logits(last), repeats),
        "sampler": timed(lambda: runner.sampler(logits, sampling), repeats),
        "tiny add_": timed(lambda: tiny.add_(1), repeats),
        "tiny device copy_": timed(lambda: tiny[:2].copy_(tiny[2:]), repeats),
        "torch.cuda.Event().record()": timed(lambda: torch.cuda.Event().record(), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,512,8x512")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    arch = yaml.safe_load(open("conf/model/qwen3_0_6b.yaml"))["arch"]
    llm = LLM("qwen3_0_6b", hf_config=arch, load_format="dummy", dtype="bfloat16", max_model_len=8192)
    runner = llm.engine.executor.runner
    for salt, size in enumerate(args.sizes.split(",")):
        STEPS.clear()
        prompts = [prompt(n, 50 + 10 * salt + i) for i, n in enumerate(prompt_sizes(size))]
        llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
        step = next(s for s in STEPS if s.is_prefill)
        with torch.inference_mode():
            rows = pieces(runner, step, args.repeats)
        print(f"\nlone prefill {size} ({step.num_tokens} tokens), host us, median of {args.repeats}:")
        for name, us in rows.items():
            print(f"  {us:8.1f}  {name}")
    llm.close()


if __name__ == "__main__":
    main()
