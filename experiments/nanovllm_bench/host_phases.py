"""Where the host's time goes in a real decode step (GPU, CUDA graphs, async scheduling).

    python experiments/nanovllm_bench/host_phases.py [--batch 1] [--input-len 1024] [--output-len 256]

At one sequence the host's work per step (bookkeeping, input tensors, the graph launch, the eager
LM head and sampler launches) hides under the device's ~0.9 ms only while the host keeps up; on a
slower host the step becomes host-bound (runs/batch1_tpot_06a3084.md). This runs the engine's own
decode loop with a timer around each host phase and prints each phase's mean per step, the wait
for the device (`collect`), and the step period, so host and device time can be told apart on the
machine at hand. Timers add ~1 us per phase.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import yaml

from nanoexp import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from timing import add_timer  # noqa: E402

from nanoexp.engine import llm_engine
from nanoexp.layers.sampler import Sampler
from nanoexp.models.qwen3 import Qwen3ForCausalLM
from nanoexp.runner import model_runner
from nanoexp.runner.cuda_graphs import DecodeGraphs

TOTALS: dict[str, float] = defaultdict(float)


PHASES = [  # (owner, attribute, label); nested phases are included in their parents
    (llm_engine.LLMEngine, "advance", "engine: advance"),
    (llm_engine.LLMEngine, "schedule_following", "engine: schedule"),
    (llm_engine, "step_input_from", "engine: step input"),
    (llm_engine.LLMEngine, "complete", "engine: complete"),
    (model_runner.ModelRunner, "launch", "runner: launch (all below)"),
    (model_runner, "prepare_step", "  inputs and sampling tensors"),
    (model_runner, "substitute_tokens", "  substitute_tokens"),
    (DecodeGraphs, "replay", "  graph buffers + replay"),
    (Qwen3ForCausalLM, "compute_logits", "  LM head"),
    (Sampler, "forward", "  sampler"),
    (model_runner, "PendingStep", "  read-back set-up"),
    (model_runner.ModelRunner, "collect", "runner: collect (waits for the device)"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3_0_6b", help="a conf/model name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    args = parser.parse_args()
    arch = yaml.safe_load(open(f"conf/model/{args.model}.yaml"))["arch"]
    llm = LLM(args.model, hf_config=arch, load_format="dummy", dtype="bfloat16", max_model_len=4096,
              max_num_seqs=max(8, args.batch))  # fmt: skip
    engine = llm.engine
    params = SamplingParams(temperature=0.6, max_tokens=args.output_len, ignore_eos=True)
    prompts = [[(7 * i + j) % 10000 for j in range(args.input_len)] for i in range(args.batch)]
    llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)  # warm-up
    for owner, attribute, label in PHASES:
        add_timer(owner, attribute, TOTALS, label)
    TOTALS.clear()
    for prompt in prompts:
        engine.add_request(prompt, params)
    periods, steps = [], 0
    while engine.has_unfinished():
        start = time.perf_counter()
        _, stats = engine.step()
        if stats.phase == "decode" and stats.num_seqs == args.batch:
            periods.append(time.perf_counter() - start)
            steps += 1
    llm.close()
    waited = TOTALS["runner: collect (waits for the device)"] / max(steps, 1) * 1e6
    period = statistics.mean(periods) * 1e6
    print(f"batch {args.batch}, {args.input_len} prompt tokens, {steps} decode steps; step period median "
          f"{statistics.median(periods) * 1e6:.0f} us, mean {period:.0f} us, of which the host waits for the "
          f"device {waited:.0f} us and works {period - waited:.0f} us")  # fmt: skip
    print("| host phase | us per step |")
    print("|---|---:|")
    for _, _, label in PHASES:
        print(f"| {label} | {TOTALS[label] / max(steps, 1) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
