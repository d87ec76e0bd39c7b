"""The engine a sweep keeps: taken over while the engine settings are equal, closed (its tensor-parallel
workers gone) when they change and when the sweep ends; never kept outside an in-process sweep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from nanoexp.config import SamplingParams
from nanoexp.experiment.job import build, engine_factory, engine_reuse
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.schema import to_spec

CONF = Path(__file__).resolve().parents[2] / "conf"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
TINY = ["model=qwen3_tiny", "cache.cpu_kv_cache_gib=0.05", "logger=none", "sampler=greedy"]


def job_parts(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        spec = to_spec(compose("config", overrides=[*TINY, *overrides]))
    checkpoint = build.resolve_checkpoint(spec.model)
    return spec, engine_factory.engine_config(spec, checkpoint), checkpoint


def sweep_job(tmp_path: Path, multirun: bool = True) -> JobInfo:
    return JobInfo(tmp_path, [], "job", None, multirun=multirun)


def rank_processes(lease) -> list:
    """The tensor-parallel worker processes of the lease's engine."""
    return list(lease.llm.engine.executor.group.procs)


def ended(procs: list, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(p.is_alive() for p in procs)


def test_equal_settings_take_over_the_engine_and_a_change_closes_it(tmp_path: Path) -> None:
    first = engine_reuse.acquire(*job_parts("workload.request_rate=10"), sweep_job(tmp_path))
    tokens = first.llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids
    first.release(ok=True)
    second = engine_reuse.acquire(
        *job_parts("workload.request_rate=20", "sampler.seed=3"), sweep_job(tmp_path)
    )
    assert second.reused and second.llm is first.llm and second.engine_id == first.engine_id
    assert second.llm.engine.block_manager.hash_to_block == {}  # the prefix cache starts empty
    assert second.llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == tokens
    second.release(ok=True)
    third = engine_reuse.acquire(*job_parts("cache.block_size=16"), sweep_job(tmp_path))
    assert not third.reused and first.llm.closed and third.engine_id == first.engine_id + 1
    third.release(ok=False)  # a failed job's engine is closed, not kept
    assert third.llm.closed and engine_reuse._kept is None


def test_no_reuse_outside_a_sweep_or_with_the_knob_off(tmp_path: Path) -> None:
    for parts, job in (
        (job_parts(), sweep_job(tmp_path, multirun=False)),
        (job_parts("engine.reuse=false"), sweep_job(tmp_path)),
    ):
        lease = engine_reuse.acquire(*parts, job)
        lease.release(ok=True)
        assert lease.llm.closed and engine_reuse._kept is None


@pytest.mark.slow
def test_tensor_parallel_workers_end_with_their_engine(tmp_path: Path) -> None:
    first = engine_reuse.acquire(*job_parts("parallel=tp2"), sweep_job(tmp_path))
    first_ranks = rank_processes(first)
    first.release(ok=True)
    assert first_ranks and all(p.is_alive() for p in first_ranks)  # kept, workers and all
    second = engine_reuse.acquire(*job_parts("parallel=tp2", "workload.request_rate=5"), sweep_job(tmp_path))
    assert second.reused and rank_processes(second) == first_ranks  # the same workers, none started
    second.release(ok=True)
    third = engine_reuse.acquire(*job_parts("parallel=tp2", "cache.block_size=16"), sweep_job(tmp_path))
    assert not third.reused and ended(first_ranks)  # the settings changed: the old engine's workers exited
    third_ranks = rank_processes(third)
    third.release(ok=True)
    engine_reuse.close_kept()  # the sweep's end
    assert third.llm.closed and ended(third_ranks)
