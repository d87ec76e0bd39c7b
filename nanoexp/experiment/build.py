"""A job's parts from its typed config: the checks across groups, the EngineConfig, the engine (ours
or the transformers baseline) and its driver, the workload and the logger; a bad config fails
cheaply, before any weights are touched."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from nanoexp import factory
from nanoexp.config import EngineConfig, ExecutionConfig, KnobError, ModelConfig
from nanoexp.config.parallel import check_split
from nanoexp.experiment.checkpoint import Checkpoint, arch_dict
from nanoexp.experiment.driver import Driver, EngineDriver
from nanoexp.experiment.schema import ConfigError, EngineKind, LoggerKind, NanoexpConfig


def check(spec: NanoexpConfig) -> None:
    """Rules across groups that need the model's architecture."""
    try:
        check_split(arch_dict(spec.model), spec.parallel.tensor_parallel_size)
        max_model_len(spec)
    except KnobError as e:
        raise ConfigError(f"{e} (model={spec.model.name})") from None


def max_model_len(spec: NanoexpConfig) -> int:
    """scheduler.max_model_len, or the model's limit when unset (checked against both)."""
    return spec.scheduler.model_len(spec.model.arch.max_position_embeddings)


def engine_config(spec: NanoexpConfig, checkpoint: Checkpoint) -> EngineConfig:
    """The sections are the engine's classes; `model.arch` goes along only with dummy weights."""
    dummy = checkpoint.load_format == "dummy"
    arch = arch_dict(spec.model) if dummy else None
    weights = {"path": checkpoint.path, "load_format": checkpoint.load_format, "arch": arch}
    model = _narrow(spec.model, ModelConfig, **weights)
    execution = _narrow(spec.engine, ExecutionConfig)
    try:
        return EngineConfig(model, spec.cache, spec.scheduler, spec.parallel, execution)
    except KnobError as e:
        raise ConfigError(str(e)) from None


def _narrow(section: Any, engine_class: type, **changes: Any) -> Any:
    """The engine's class from a section that extends it: the engine sees only its own fields."""
    values = {f.name: getattr(section, f.name) for f in fields(engine_class)}
    return engine_class(**(values | changes))


def build_llm(spec: NanoexpConfig, config: EngineConfig, checkpoint: Checkpoint):
    """Our LLM (through the engine factory), or the transformers baseline (engine=hf)."""
    if spec.engine.kind is EngineKind.hf:
        from nanoexp.experiment.hf_baseline import HFBaseline

        e = config.execution
        dtype, max_batch = config.model.dtype, config.scheduler.max_num_seqs
        max_batch = min(max_batch, spec.workload.max_concurrency or max_batch)
        return HFBaseline(arch_dict(spec.model), checkpoint.path, dtype, e.device, e.seed, max_batch)
    return factory.build_engine(config)


def build_driver(spec: NanoexpConfig, llm) -> Driver:
    """What submits the workload: the baseline drives itself, our engine goes step by step."""
    if spec.engine.kind is EngineKind.hf:
        return llm  # its batches are capped at workload.max_concurrency (build_llm)
    return EngineDriver(llm.engine, spec.workload.max_concurrency)


def build_tokenizer(checkpoint: Checkpoint):
    """The checkpoint's tokenizer (for text prompts); None with dummy weights."""
    if checkpoint.path is None:
        return None
    from nanoexp.loader import load_tokenizer

    return load_tokenizer(checkpoint.path)


def build_workload(spec: NanoexpConfig, tokenizer=None):
    from nanoexp.experiment.workloads import WorkloadError, build_workload

    tokenize = (lambda text: tokenizer.encode(text)) if tokenizer is not None else None
    try:
        workload = build_workload(spec.workload, spec.sampler, spec.model.arch.vocab_size, tokenize)
    except (WorkloadError, ValueError) as e:
        raise ConfigError(str(e)) from None
    longest = max(len(r.prompt_token_ids) + r.sampling_params.max_tokens for r in workload.requests)
    if longest > max_model_len(spec):
        raise ConfigError(
            f"workload {spec.workload.name} has a request of {longest} tokens (prompt + max_tokens) "
            f"> max_model_len={max_model_len(spec)} (scheduler.max_model_len or the model's limit)"
        )
    return workload


def build_logger(spec: NanoexpConfig):
    """The selected logger fanned out with the always-on local sink."""
    from nanoexp.experiment.loggers import FanoutLogger, LocalSink

    if spec.logger.kind is LoggerKind.wandb:
        from nanoexp.experiment.wandb_logger import WandbLogger

        return FanoutLogger([WandbLogger(spec.logger), LocalSink()])
    return FanoutLogger([LocalSink()])
