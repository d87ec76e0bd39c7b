"""Sweeps that keep the engine: Hydra's basic launcher runs a sweep's jobs one after another in one process,
so a job whose engine settings (the EngineConfig: model and weights, parallel, cache, scheduler, the
engine's knobs) equal the previous job's takes over its engine instead of building one, as `vllm bench
sweep serve` restarts its server only when a server parameter changes. The workload, sampler, metrics,
repeats and seeds are not engine settings. A reused engine starts the job as a fresh one would: empty
prefix cache, request ids from 0. `engine.reuse=false` turns it off; the engine kept after a job is closed
when the next job needs another, and when the sweep ends."""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanoexp.config import EngineConfig
from nanoexp.engine.llm import LLM
from nanoexp.engine.llm_engine import LLMEngine
from nanoexp.experiment.job import build, engine_factory
from nanoexp.experiment.measure.driver import Driver, EngineDriver
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.schema import EngineKind, NanoexpConfig

if TYPE_CHECKING:
    from nanoexp.experiment.measure.hf_baseline import HFBaseline

log = logging.getLogger(__name__)
SUBMITIT_EXECUTOR = "SUBMITIT_EXECUTOR"  # set in the jobs submitit starts: one process per job


@dataclass
class Lease:
    """The engine a job runs on; `release` hands it back (kept for the next job, or closed)."""

    llm: LLM | HFBaseline  # ours, or the transformers baseline (never kept)
    driver: Driver
    key: str
    engine_id: int  # which engine of this process (1 = the first built)
    reused: bool
    keep: bool  # whether the next job may take it over

    @property
    def engine(self) -> LLMEngine:
        """Our engine's step loop (the KV-cache and weight probes run on ours only)."""
        assert isinstance(self.llm, LLM), "the transformers baseline has no LLMEngine"
        return self.llm.engine

    @property
    def facts(self) -> dict:
        return {"engine_reused": self.reused, "engine_id": self.engine_id}

    def release(self, ok: bool) -> None:
        """Kept when the job ended well and reuse applies; closed otherwise (a failed job's engine may hold
        requests or a dead worker)."""
        global _kept
        if ok and self.keep and isinstance(self.llm, LLM) and not self.llm.closed:
            _kept = self
        else:
            self.llm.close()


_kept: Lease | None = None
_engine_ids = itertools.count(1)


def reusable(spec: NanoexpConfig, job: JobInfo) -> bool:
    """Reuse needs the knob, our engine, and a sweep whose jobs run in this process."""
    in_process = job.multirun and SUBMITIT_EXECUTOR not in os.environ
    return spec.engine.reuse and spec.engine.kind is EngineKind.nanoexp and in_process


def acquire(spec: NanoexpConfig, config: EngineConfig, checkpoint: build.Checkpoint, job: JobInfo) -> Lease:
    """The kept engine when its settings are the job's (reset for the job), else a new one (the kept one
    closed first, so its memory is free for the new one)."""
    global _kept
    # a new trial is an independent run (DESIGN: the unit of a verdict): it always builds its own engine
    key, keep = repr((config, spec.trial)), reusable(spec, job)
    kept, _kept = _kept, None
    if kept is not None and (not keep or kept.key != key or kept.engine.closed):
        log.info("engine settings changed: closing engine %d", kept.engine_id)
        kept.llm.close()
        kept = None
    if kept is not None:
        engine = kept.engine  # only ours is ever kept (`release`)
        engine.reset_for_next_job()
        return Lease(
            kept.llm, EngineDriver(engine, spec.workload.max_concurrency), key, kept.engine_id, True, keep
        )
    llm, driver = engine_factory.build_llm(spec, config, checkpoint)
    return Lease(llm, driver, key, next(_engine_ids), False, keep)


def close_kept() -> None:
    """Closes the engine kept for a next job (at the sweep's end)."""
    global _kept
    kept, _kept = _kept, None
    if kept is not None:
        kept.llm.close()
