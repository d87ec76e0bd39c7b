"""Host cost of one overlapped decode step, the model replaced by a stub (CPU).

With `async_scheduling` the host schedules and prepares step n+1 while the device runs step n, so
a step whose host work outlasts its device work leaves the GPU idle: the host loop is the floor of
small-batch steps. This times `LLMEngine.step()` per decode step at a given batch with a stub in
place of the forward pass and sampler (it still builds every input tensor, as the GPU path does
before its host-to-device copies), plus whatever the experiment layer does per step in the loop
(the experiment's StepLog feeding W&B offline and the local sink): `none` (no logging),
`in-loop` (each step sent to the loggers as it ends, as before) and `deferred` (sent after the
pass, what the experiment does now), one column each. With `--tp 2` the steps go through the
worker processes (gloo on CPU): the step ring, each rank's input preparation, the all-gather of
the sampled winners and rank 0's reply; the stub is installed at import, so the spawned workers run it too.

    python experiments/tools/host_step.py [--batches 1,8,64,256] [--tp 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from nanoexp import LLM, SamplingParams
from nanoexp.experiment.measure.driver import StepLog
from nanoexp.experiment.metrics.summarize import step_row
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.schema import LoggerConfig
from nanoexp.experiment.sinks.local import FanoutLogger, LocalSink
from nanoexp.experiment.sinks.wandb_sink import WandbLogger
from nanoexp.runner.model_runner import ModelRunner, exchange_winners

CONTEXT = 1024
STEPS = 200


def stub_forward_step(runner, step, prev_tokens=None):
    """forward_step without the model: inputs and sampling tensors built, token 7 sampled; under TP
    the ranks exchange their winners as the sharded sampler does (one all-gather)."""
    runner.prepare(step)
    if not step.sample_seq_indices:
        return torch.empty(0, dtype=torch.int64, device=runner.device), True
    tokens = torch.full((len(step.sample_seq_indices),), 7, dtype=torch.int64, device=runner.device)
    if runner.tp > 1:
        tokens = exchange_winners(torch.zeros_like(tokens, dtype=torch.float32), tokens)
    return tokens, True


ModelRunner.forward_step = stub_forward_step  # at import: spawned TP workers import this module too


def per_step_logger(out_dir: Path):
    os.environ.setdefault("WANDB_MODE", "offline")
    job = JobInfo(out_dir=out_dir, overrides=[], name="host_step", group="host_step")
    logger = FanoutLogger([WandbLogger(LoggerConfig()), LocalSink()])
    logger.start({}, job)
    return logger


def time_batch(llm: LLM, batch: int, log: StepLog | None, in_loop: bool) -> float:
    """Median wall time of one decode step (us) at `batch` sequences of ~CONTEXT tokens."""
    engine = llm.engine
    params = SamplingParams(temperature=0.6, max_tokens=STEPS + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request([(i + j) % 1000 + 3 for j in range(CONTEXT)], params)
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        _, stats = engine.step()
        if log is not None:
            log(stats)
            if in_loop:
                log.flush()
        if stats.phase == "decode" and stats.num_seqs == batch:
            times.append(time.perf_counter() - start)
    return statistics.median(times[5:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (worker processes)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: inputs then go through pinned copies")
    args = parser.parse_args()
    arch = yaml.safe_load(open("conf/model/qwen3_tiny.yaml"))["arch"] | {"vocab_size": 10240}
    llm = LLM(
        "qwen3_tiny",
        hf_config=arch,
        load_format="dummy",
        device=args.device,
        dtype="float32",
        max_num_seqs=256,
        max_model_len=CONTEXT + STEPS + 16,
        num_kv_blocks=2048,
        kv_block_size=256,
        async_scheduling=True,
        max_num_batched_tokens=16384,
        tensor_parallel_size=args.tp,
    )
    with tempfile.TemporaryDirectory() as tmp:
        logger = per_step_logger(Path(tmp))
        log = StepLog(lambda i, s, t, r: logger.log_step(i, step_row(i, s, t, r)))
        print("| batch | no logging us | logged in the loop us | logged after the pass us |")
        print("|---:|---:|---:|---:|")
        for batch in map(int, args.batches.split(",")):
            cells = [time_batch(llm, batch, None, False), time_batch(llm, batch, log, True)]
            cells.append(time_batch(llm, batch, log, False))
            log.flush()
            print(f"| {batch} | " + " | ".join(f"{c:.0f}" for c in cells) + " |", flush=True)
        logger.finish({})
    llm.close()


if __name__ == "__main__":
    main()
