"""Runs steps on all ranks: in this process for one rank, in worker processes for several."""

from __future__ import annotations

import json
import os

from nanoexp.config import EngineConfig
from nanoexp.layers.linear import divisors, kv_heads_fit, not_divisible
from nanoexp.runner.model_runner import ModelRunner
from nanoexp.runner.step_input import StepInput


def eos_token_ids(runner: ModelRunner) -> list[int]:
    ids = runner.hf_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    model = runner.config.model
    gen_path = os.path.join(model.path or "", "generation_config.json")
    if model.arch is None and os.path.isfile(gen_path):
        with open(gen_path) as f:
            extra = json.load(f).get("eos_token_id")
        ids += [] if extra is None else [extra] if isinstance(extra, int) else extra
    return sorted(set(ids))


def runner_info(runner: ModelRunner) -> dict:
    return {
        "vocab_size": runner.hf_config.vocab_size,
        "max_model_len": runner.max_model_len,
        "eos_token_ids": eos_token_ids(runner),
        "num_kv_blocks": runner.num_blocks,
    }


def check_tp_size(hf_config, size: int) -> None:
    """Fails before any rank starts if the model cannot be split `size` ways; the message names
    the dimension that does not divide and the sizes that would work."""
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    dims = {"num_attention_heads": heads, "intermediate_size": hf_config.intermediate_size}
    fits = lambda d: all(v % d == 0 for v in dims.values()) and kv_heads_fit(kv_heads, d)
    if fits(size):
        return
    ok = [d for d in divisors(heads) if fits(d)]
    for name, value in {**dims, "num_key_value_heads": kv_heads}.items():
        if value % size:
            raise not_divisible(name, value, size, ok)


class InProcessExecutor:
    def __init__(self, config: EngineConfig):
        self.runner = ModelRunner(config)
        self.info = runner_info(self.runner)

    def run(self, step: StepInput) -> list[int]:
        return self.runner.run(step)

    def launch(self, step: StepInput) -> None:
        self.runner.launch(step)

    def collect(self) -> list[int]:
        return self.runner.collect()

    def prefill_logits(self, step: StepInput):
        return self.runner.prefill_logits(step)

    def stats(self) -> dict:
        return self.runner.stats()

    def close(self) -> None:
        self.runner.close()


def make_executor(config: EngineConfig):
    if config.parallel.tensor_parallel_size == 1:
        return InProcessExecutor(config)
    from nanoexp.runner.workers import MultiprocExecutor

    return MultiprocExecutor(config)
