"""The engine factory: the typed config and the checkpoint found in, the engine out. The engine's config
classes are built here from the groups, field by field (cache, scheduler and parallel are the engine's
classes already); the engine itself by nanoexp.factory, or the transformers baseline for engine=hf."""

from __future__ import annotations

from typing import Any

from nanoexp import factory
from nanoexp.config import EngineConfig, ExecutionConfig, ModelConfig
from nanoexp.experiment.job.build import Checkpoint
from nanoexp.experiment.measure.driver import Driver, EngineDriver
from nanoexp.experiment.schema import EngineGroup, EngineKind, ModelGroup, NanoexpConfig


def engine_config(spec: NanoexpConfig, checkpoint: Checkpoint) -> EngineConfig:
    """The engine's settings: everything the engine runs with, nothing the job alone uses."""
    return EngineConfig(
        model=model_config(spec.model, checkpoint),
        cache=spec.cache,
        scheduler=spec.scheduler,
        parallel=spec.parallel,
        execution=execution_config(spec.engine),
    )


def model_config(model: ModelGroup, checkpoint: Checkpoint) -> ModelConfig:
    """The weights are the checkpoint's; `model.arch` goes along only with dummy weights."""
    return ModelConfig(
        path=checkpoint.path,
        dtype=model.dtype,
        load_format=checkpoint.load_format,
        arch=model.arch.as_dict() if checkpoint.load_format == "dummy" else None,
        quantization=model.quantization,
    )


def execution_config(engine: EngineGroup) -> ExecutionConfig:
    return ExecutionConfig(**engine.execution_knobs())


def build_llm(spec: NanoexpConfig, config: EngineConfig, checkpoint: Checkpoint) -> tuple[Any, Driver]:
    """The engine and what submits the workload to it: the baseline drives itself (its batches capped at
    workload.max_concurrency), our engine goes step by step."""
    if spec.engine.kind is EngineKind.hf:
        from nanoexp.experiment.measure.hf_baseline import HFBaseline

        e, arch, batch = config.execution, spec.model.arch.as_dict(), config.scheduler.max_num_seqs
        batch = min(batch, spec.workload.max_concurrency or batch)
        baseline = HFBaseline(arch, checkpoint.path, config.model.dtype, e.device, e.seed, batch)
        return baseline, baseline
    llm = factory.build_engine(config)
    return llm, EngineDriver(llm.engine, spec.workload.max_concurrency)
