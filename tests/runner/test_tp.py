"""Tensor parallelism on CPU (gloo): TP=2/4 match TP=1 exactly, and worker failures surface fast."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import cache

import pytest
import torch
from checkpoints import random_prompts
from helpers import prefill_logits, signal_soon, staggered_run
from tp_checkpoints import (
    BLOCK,
    ENGINE,
    GREEDY,
    MODELS,
    PROMPTS,
    assert_no_workers,
    build_checkpoint,
    is_running,
)

from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM
from nanoexp.runner.step_input import StepInput


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    return {name: build_checkpoint(tmp_path_factory.mktemp(name), name) for name in MODELS}


def frozen_objects(runner) -> int:
    return gc.get_freeze_count()


def prefill_step() -> StepInput:
    """All prompts as one prefill into disjoint blocks of a fresh cache."""
    lens = [len(p) for p in PROMPTS[:3]]
    per_seq = -(-max(lens) // BLOCK)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(lens))]
    tokens = [t for p in PROMPTS[:3] for t in p]
    return StepInput(True, tokens, lens, lens, tables, [])


def run(model: str, tp: int) -> tuple[torch.Tensor, list]:
    """Prefill logits (first, while the cache is fresh), then greedy generation. Workers have frozen
    their start-up heap: a full collection in one rank stalls every rank's step."""
    with LLM(model, tensor_parallel_size=tp, **ENGINE) as llm:
        assert tp == 1 or llm.engine.executor.call(frozen_objects) > 0
        logits = prefill_logits(llm, prefill_step())
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert llm.stats()["sharded_sampling"] is (tp > 1)
    assert_no_workers()
    return logits, outputs


@cache
def reference(model: str) -> tuple[torch.Tensor, list]:
    logits, outputs = run(model, 1)
    assert sum(o.num_preemptions for o in outputs) > 0, "the KV cache is meant to force preemption"
    assert sum(o.num_cached_tokens for o in outputs) > 0, "the shared prefix is meant to hit the cache"
    return logits, outputs


def assert_same_generation(got: list, want: list) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.num_preemptions for o in got] == [o.num_preemptions for o in want]
    assert [o.num_cached_tokens for o in got] == [o.num_cached_tokens for o in want]


@pytest.mark.parametrize(
    "name,tp", [("qwen3_kv4", 2), ("qwen3_kv4", 4), ("qwen3_kv2_pad", 4), ("qwen2_bias", 2)]
)
def test_tp_matches_tp1(models, name, tp):
    """Greedy steps are drawn from each rank's vocabulary shard (the default); each worker froze what
    it built at start-up (run)."""
    want_logits, want = reference(models[name])
    logits, got = run(models[name], tp)
    assert logits.shape == want_logits.shape == (sum(len(p) for p in PROMPTS[:3]), MODELS[name][2])
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    assert_same_generation(got, want)


def test_tp_with_gathered_sampling_matches_tp1(models):
    """parallel.sharded_sampling=false: rank 0 gathers the full logits and broadcasts the tokens
    (the default draws greedy steps from each rank's vocabulary shard)."""
    want = reference(models["qwen3_kv2_pad"])[1]
    with LLM(models["qwen3_kv2_pad"], tensor_parallel_size=2, sharded_sampling=False, **ENGINE) as llm:
        assert llm.engine.config.parallel.sharded_sampling is False
        got = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert llm.stats()["sharded_sampling"] is False
    assert_no_workers()
    assert_same_generation(got, want)


LONG_PROMPT = [(7 * i + 3) % 120 for i in range(45)]  # more than one step's token budget


@pytest.mark.parametrize("name,tp", [("qwen3_kv4", 2), ("qwen3_kv2_pad", 4)])
def test_overlapped_tp_matches_sync_tp1(models, name, tp):
    """async_scheduling with workers (the default): rank 0 broadcasts each step's samples, so every
    rank builds the next step's inputs on its device before the host has read them. With prefix
    caching, chunked prefill (the long prompt) and preemption (the small cache)."""
    prompts = PROMPTS + [LONG_PROMPT]
    params = [
        GREEDY if i % 2 else SamplingParams(temperature=0.9, seed=i, max_tokens=10, ignore_eos=True)
        for i in range(len(prompts))
    ]
    engine = {**ENGINE, "num_kv_blocks": 16, "max_num_batched_tokens": 32}
    outputs = {}
    for size, overlap in ((1, False), (tp, None)):
        with LLM(
            models[name],
            tensor_parallel_size=size,
            **engine,
            **({} if overlap is None else {"async_scheduling": overlap}),
        ) as llm:
            assert llm.engine.config.scheduler.async_scheduling is (size > 1)
            outputs[size] = llm.generate(prompts, params, use_tqdm=False)
            assert llm.engine.block_manager.num_used == 0
    assert_no_workers()
    # mixed steps are scheduled before the previous step's tokens are read, so preemption can pick
    # other victims than in the synchronous run: the tokens must still match
    assert [o.token_ids for o in outputs[tp]] == [o.token_ids for o in outputs[1]]
    assert sum(o.num_preemptions for o in outputs[tp]) > 0
    assert sum(o.num_cached_tokens for o in outputs[tp]) > 0
    assert len(LONG_PROMPT) > engine["max_num_batched_tokens"]


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
@pytest.mark.parametrize("tp", [2, 4])
def test_staggered_arrivals_under_tp_match_transformers(checkpoints, reference_outputs, tp, batching):
    """One request added every two steps, so prefills arrive while others decode (mixed steps
    under mixed batching), with chunked prefill, a shared prefix in the cache and preemption (a
    small cache): the greedy tokens are transformers' under both batching policies."""
    name = "qwen3_gqa4"  # 8 heads, 2 kv heads: replicated at TP=4
    shared = random_prompts([24], seed=40)[0]
    prompts = random_prompts([30, 5, 41, 1], seed=41) + [shared + [1], shared + [2, 3]]
    engine = dict(
        device="cpu",
        dtype="float32",
        tensor_parallel_size=tp,
        batching=batching,
        kv_block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=24,
        enable_prefix_caching=True,
    )
    with LLM(checkpoints[name][0], **engine) as llm:
        outputs, seen = staggered_run(llm, prompts, max_tokens=8)
    assert_no_workers()
    for prompt, tokens in zip(prompts, outputs, strict=True):
        assert tokens == reference_outputs(name, prompt, 8), f"prompt length {len(prompt)}"
    assert (seen["mixed"] > 0) == (batching == "mixed")
    assert seen["preemptions"] > 0 and seen["prefix_hits"] > 0


def test_two_engines_at_once(models):
    want_a, want_b = reference(models["qwen3_kv4"])[1], reference(models["qwen2_bias"])[1]
    with LLM(models["qwen3_kv4"], tensor_parallel_size=2, **ENGINE) as a:
        with LLM(models["qwen2_bias"], tensor_parallel_size=2, **ENGINE) as b:
            got_b = b.generate(PROMPTS, GREEDY, use_tqdm=False)
            got_a = a.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_same_generation(got_a, want_a)
    assert_same_generation(got_b, want_b)
    assert_no_workers()


def test_killed_worker_raises_quickly_and_leaves_no_processes(models):
    llm = LLM(models["qwen3_kv4"], tensor_parallel_size=2, **{**ENGINE, "num_kv_blocks": 1024})
    victim = llm.engine.executor.group.procs[1].pid
    killed_at = signal_soon(victim, signal.SIGKILL)
    long = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    with pytest.raises(RuntimeError, match=r"worker rank 1 died \(exit code -9, SIGKILL\)"):
        llm.generate([p[:4] for p in PROMPTS], long, use_tqdm=False)
    assert time.monotonic() - killed_at[0] < 10
    assert_no_workers()
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    llm.close()
    llm.close()


def test_close_is_idempotent_and_reaps_workers(models):
    llm = LLM(models["qwen3_kv4"], tensor_parallel_size=2, **ENGINE)
    assert len(mp.active_children()) == 2
    stats = llm.stats()
    assert stats["tensor_parallel_size"] == 2
    per_rank = stats["peak_memory_bytes_per_rank"]  # every rank's peak, not rank 0's alone
    assert (
        len(per_rank) == 2
        and all(p > 0 for p in per_rank)
        and stats["peak_memory_bytes_total"] == sum(per_rank)
    )
    assert stats["weights_bytes_total"] == sum(stats["weights_bytes_per_rank"]) > stats["weights_bytes"]
    llm.close()
    llm.close()
    assert_no_workers()


@pytest.mark.parametrize(
    "overrides,tp,allowed",
    [
        (
            {"num_attention_heads": 6, "num_key_value_heads": 6},
            4,
            "one of 1, 2, 3, 6 (num_attention_heads=6 is not divisible)",
        ),
        (
            {"num_attention_heads": 12, "num_key_value_heads": 3},
            2,
            "one of 1, 3, 6, 12 (num_key_value_heads=3 is not divisible)",
        ),
        ({"intermediate_size": 90}, 4, "one of 1, 2 (intermediate_size=90 is not divisible)"),
    ],
)
def test_indivisible_sizes_fail_before_spawning(overrides, tp, allowed):
    hf = dict(
        model_type="qwen3",
        vocab_size=64,
        hidden_size=96,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
    )
    with pytest.raises(ValueError) as err:
        LLM("dummy", tensor_parallel_size=tp, load_format="dummy", hf_config={**hf, **overrides}, **ENGINE)
    assert str(err.value) == f"tensor_parallel_size={tp} is invalid: must be {allowed}"  # the keyword typed
    assert_no_workers()


def test_too_long_max_model_len_fails_before_spawning(models):
    with pytest.raises(ValueError, match=r"^max_model_len=1025 is invalid: must be <= 1024"):  # the keyword
        LLM(models["qwen3_kv4"], tensor_parallel_size=2, **{**ENGINE, "max_model_len": 1025})
    assert_no_workers()


def test_worker_startup_error_keeps_type_and_message(models, tmp_path):
    shutil.copy(os.path.join(models["qwen3_kv4"], "config.json"), tmp_path)
    with pytest.raises(FileNotFoundError) as want:
        LLM(str(tmp_path), tensor_parallel_size=1, **ENGINE)
    with pytest.raises(FileNotFoundError) as got:
        LLM(str(tmp_path), tensor_parallel_size=2, **ENGINE)
    assert str(got.value) == str(want.value)
    assert_no_workers()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tp1_on_cuda_matches_cpu(models):
    want_logits, want = reference(models["qwen3_kv4"])
    with LLM(models["qwen3_kv4"], tensor_parallel_size=1, **{**ENGINE, "device": "cuda"}) as llm:
        logits = prefill_logits(llm, prefill_step())
        got = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    torch.testing.assert_close(logits.cpu(), want_logits, rtol=1e-3, atol=1e-3)
    assert_same_generation(got, want)


ORPHAN_SCRIPT = """
import os, signal
from nanoexp.engine.llm import LLM
llm = LLM({model!r}, tensor_parallel_size=2, **{engine!r})
group = llm.engine.executor.group
print(group.tmpdir, "/dev/shm/" + group.ring.handle.name, *(p.pid for p in group.procs), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_exit_and_clean_up_when_the_main_process_is_killed(models):
    script = ORPHAN_SCRIPT.format(model=models["qwen3_kv4"], engine=ENGINE)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    tmpdir, ring, *pids = proc.stdout.split()
    pids = [int(p) for p in pids]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(is_running, pids))
    assert not os.path.exists(tmpdir), "the rendezvous directory outlived the workers"
    assert not os.path.exists(ring), "the shared-memory ring outlived the workers"


CHILD_WITH_PROGRESS_BAR = """
import multiprocessing as mp, os, sys
from tqdm import tqdm
from nanoexp.runner.workers import use_thread_lock_for_tqdm

def child(fixed):
    if fixed:
        use_thread_lock_for_tqdm()
    for _ in tqdm(range(2), file=sys.stderr):
        pass
    os._exit(0)  # as a worker exits

if __name__ == "__main__":
    proc = mp.get_context("spawn").Process(target=child, args=(sys.argv[1] == "fixed",))
    proc.start()
    proc.join()
"""


@pytest.mark.parametrize("fixed", [False, True])
def test_worker_progress_bars_leave_no_semaphore_behind(tmp_path, fixed):
    script = tmp_path / "child.py"
    script.write_text(CHILD_WITH_PROGRESS_BAR)
    arg = "fixed" if fixed else "plain"
    out = subprocess.run([sys.executable, str(script), arg], capture_output=True, text=True, timeout=120)
    assert ("leaked semaphore" in out.stderr) is not fixed, out.stderr
