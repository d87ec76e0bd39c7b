"""Test-only views into the engine, computed through its public pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoexp.config import EngineConfig, SamplingParams
from nanoexp.engine.llm_engine import LLMEngine
from nanoexp.runner.inputs import prepare_inputs
from nanoexp.runner.step_input import RunnerInfo, StepInput

ROOT = Path(__file__).resolve().parents[1]  # the repository: run.py, conf/, scripts/
TINY_JOB = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05"]  # a run.py job that takes seconds on a CPU


def quick_first(argnames: str, values: list, quick: int = 0) -> tuple[str, list]:
    """`@pytest.mark.parametrize(*quick_first("n, k", [...]))`: the case at index `quick` runs in the quick
    loop (`pytest -m "not slow"`), the others are `slow`; the full suite runs them all, with the same ids."""
    multiple = "," in argnames
    cases = []
    for i, value in enumerate(values):
        args = value if multiple else (value,)
        cases.append(value if i == quick else pytest.param(*args, marks=pytest.mark.slow))
    return argnames, cases


def job_env(home: Path) -> dict[str, str]:
    """The environment of a run.py subprocess: no W&B key (offline), no Hydra full errors, this tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    # run.py may load a callback from a test module (`tests.e2e....`), which imports the shared helpers
    return env | {"HOME": str(home), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def run_py(
    home: Path, *args: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`python run.py *args` from the repository root, with `job_env(home)` plus `env`."""
    cmd = [sys.executable, "run.py", *args]
    full_env = job_env(home) | (env or {})
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


@torch.inference_mode()
def runner_prefill_logits(runner, step: StepInput) -> torch.Tensor | None:
    """Logits of every new token of a prefill step on one rank (None on ranks other than 0)."""
    inputs = prepare_inputs(step, runner.block_size, runner.device)
    hidden = runner.model(inputs.input_ids, inputs.positions, inputs.md)
    return runner.model.compute_logits(hidden)


def prefill_logits(llm, step: StepInput) -> torch.Tensor:
    """The step's logits from rank 0, with every rank taking part (the LM head gathers)."""
    return llm.engine.executor.call(runner_prefill_logits, step)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def assert_follows_transformers(hf_model, prompts, outs, min_exact: float = 0.5) -> int:
    """bf16 policy: where our greedy tokens first differ from transformers (float32, teacher-forced
    on our tokens), ours must be in its top 3, and at least `min_exact` of the prompts must match
    exactly (random tiny models have near-tied logits, so bf16 flips some). Returns the exact count."""
    exact = 0
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + out.token_ids])).logits[0]
        hf_choice = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        i = first_divergence(out.token_ids, hf_choice)
        if i is None:
            exact += 1
            continue
        top3 = logits[len(prompt) - 1 + i].topk(3).indices.tolist()
        assert out.token_ids[i] in top3, f"prompt length {len(prompt)}: token {i} outside top-3"
    assert exact >= min_exact * len(prompts), f"{exact} of {len(prompts)} exact"
    return exact


def signal_soon(pid: int, sig: int, delay_s: float = 1.0) -> list[float]:
    """Sends `sig` to `pid` from a thread after `delay_s`; the returned list then holds the
    monotonic time it was sent."""
    sent_at: list[float] = []

    def send() -> None:
        time.sleep(delay_s)
        sent_at.append(time.monotonic())
        os.kill(pid, sig)

    threading.Thread(target=send, daemon=True).start()
    return sent_at


def staggered_run(llm, prompts, max_tokens: int, every: int = 2) -> tuple[list[list[int]], Counter]:
    """Adds one request every `every` steps, so prefills arrive while others decode; returns each
    prompt's tokens and what the steps did: a count per phase, preemptions and prefix-cache hits."""
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    pending, ids, outputs, seen, step = list(enumerate(prompts)), {}, {}, Counter(), 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            index, prompt = pending.pop(0)
            ids[engine.add_request(prompt, params)] = index
        finished, stats = engine.step()
        seen.update({stats.phase: 1, "preemptions": stats.num_preemptions})
        seen["prefix_hits"] += stats.prefix_cache_hits
        outputs.update({ids[out.request_id]: out.token_ids for out in finished})
        step += 1
    assert engine.block_manager.num_used == 0
    return [outputs[i] for i in range(len(prompts))], seen


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
WANDB = Path(sys.executable).with_name("wandb")


def compose_cfg(*overrides: str):
    """conf/config.yaml composed with `overrides`, as run.py would."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]


def wandb_state(results: dict) -> dict:
    """The offline W&B run of a job, read back by wandb's own inspector."""
    run_dir = results["job"]["wandb"]["dir"]
    cmd = [str(WANDB), "leet", "inspect", "--json", "--summary", run_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class StandInExecutor:
    """An executor without a model, for the control plane alone: every sample is token 1, and
    `on_step(i)` runs inside the i-th step's run or collect."""

    closed = False

    def __init__(self, on_step: Callable[[int], None] = lambda i: None, num_blocks: int = 64):
        self.info = RunnerInfo(vocab_size=50, max_model_len=256, eos_token_ids=[49], num_kv_blocks=num_blocks)
        self.on_step, self.num_steps, self.launched = on_step, 0, deque()

    def run(self, step: StepInput) -> list[int]:
        self.on_step(self.num_steps)
        self.num_steps += 1
        return [1] * len(step.sample_seq_indices)

    def launch(self, step: StepInput) -> None:
        self.launched.append([1] * len(step.sample_seq_indices))

    def collect(self) -> list[int]:
        self.on_step(self.num_steps)
        self.num_steps += 1
        return self.launched.popleft()

    def set_phase_hooks(self, hooks) -> bool:
        return False  # no runner here to report its phases

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def stand_in_engine(executor: StandInExecutor, **kwargs) -> LLMEngine:
    """The real control plane (scheduler, block manager) over `executor`; kwargs as LLM's."""
    config = EngineConfig.from_kwargs("stand-in", kv_block_size=4, num_kv_blocks=64, **kwargs)
    return LLMEngine(config, executor)


class CompileLog:
    """Names the Triton kernels compiled (or loaded from the disk cache) while installed, and counts the
    graphs torch.compile made meanwhile (`torch_graphs`)."""

    def __init__(self):
        import triton

        self.knobs = triton.knobs.runtime
        self.names: list[str] = []
        self.torch_graphs = 0

    def __enter__(self):
        self.previous = self.knobs.jit_post_compile_hook
        self.graphs_before = torch_compiled_graphs()

        def hook(*args, **kwargs):
            fn = kwargs.get("fn")
            self.names.append(getattr(fn, "name", None) or str(kwargs.get("repr", "?"))[:120])
            return self.previous(*args, **kwargs) if self.previous else None

        self.knobs.jit_post_compile_hook = hook
        return self

    def __exit__(self, *exc):
        self.knobs.jit_post_compile_hook = self.previous
        self.torch_graphs = torch_compiled_graphs() - self.graphs_before


def torch_compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
