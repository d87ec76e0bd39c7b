"""Host cost of each piece of a lone prefill step's input upload and graph replay (GPU).

Builds the engine as prefill_profile.py does, records the StepInput of a lone prefill of each size,
then times each piece of the runner's path for it on the host (perf_counter, the device idle
before each repeat, median of --repeats): the numpy layout, the tile table, the whole input
upload, the graph launch, the LM head and the sampler; and, to calibrate, one tiny device op.
(The version that timed the upload before step graphs read their inputs from pinned mirrors, and
its log, are in git history; the log is the first call in `../serving/runs/device_calls_1bbedc8.log`.)

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
from nanoexp.kernels.prefill_tiles import prefill_tiles
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
    """The pieces of the runner's path for a step that runs in a step graph: its inputs written
    into a pinned mirror of the graph's buffers and uploaded in one copy (runner.prepare), then
    the replay, the LM head and the sampler."""
    graphs, device = runner.step_graphs, runner.device
    model_inputs, sampling = runner.prepare(step)
    graph = graphs.graphs[model_inputs.graph_key]
    tiny = torch.zeros(4, device=device)
    hidden = graphs.replay(model_inputs)
    last = hidden[model_inputs.logits_indices]
    logits = runner.model.compute_logits(last)
    tile_m = graphs.tile_block_m(graphs.size_for(step.num_tokens))
    tables = np.zeros((len(step.block_tables), max(map(len, step.block_tables))), dtype=np.int32)
    return {
        "token_layout": timed(lambda: runner_inputs.token_layout(step, runner.block_size, tables), repeats),
        "prefill_tiles": timed(
            lambda: prefill_tiles(step.query_lens, step.context_lens, step.num_decodes, tile_m), repeats
        ),
        "whole runner.prepare (mirror, one copy)": timed(lambda: runner.prepare(step), repeats),
        "graph.replay()": timed(graph.replay, repeats),
        "hidden[logits_indices]": timed(lambda: hidden[model_inputs.logits_indices], repeats),
        "LM head": timed(lambda: runner.model.compute_logits(last), repeats),
        "sampler": timed(lambda: runner.sampler(logits, sampling), repeats),
        "tiny add_": timed(lambda: tiny.add_(1), repeats),
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
        step = next(s for s in STEPS if s.has_prefill)
        with torch.inference_mode():
            rows = pieces(runner, step, args.repeats)
        print(f"\nlone prefill {size} ({step.num_tokens} tokens), host us, median of {args.repeats}:")
        for name, us in rows.items():
            print(f"  {us:8.1f}  {name}")
    llm.close()


if __name__ == "__main__":
    main()
