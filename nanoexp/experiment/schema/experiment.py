"""The whole experiment's config (conf/config.yaml and the presets of conf/experiment/): every group, the
job's own knobs and the rules across groups; and the typed config from the one Hydra composed. The
`parallel`, `cache` and `scheduler` groups are the engine's config classes as they are."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from nanoexp.config import CacheConfig, KnobError, ParallelConfig, SchedulerConfig
from nanoexp.config.aliases import rename_keys
from nanoexp.config.checks import integer
from nanoexp.experiment.schema.capacity import CapacityConfig
from nanoexp.experiment.schema.common import ConfigError
from nanoexp.experiment.schema.engine import EngineGroup, EngineKind
from nanoexp.experiment.schema.launch import LaunchConfig
from nanoexp.experiment.schema.logger import LoggerConfig
from nanoexp.experiment.schema.metrics import MetricsConfig
from nanoexp.experiment.schema.model import ModelGroup
from nanoexp.experiment.schema.profile import ProfileConfig
from nanoexp.experiment.schema.report import ReportConfig
from nanoexp.experiment.schema.sampler import SamplerConfig
from nanoexp.experiment.schema.search import SearchConfig
from nanoexp.experiment.schema.workload import WorkloadConfig, WorkloadKind


@dataclass
class NanoexpConfig:
    model: ModelGroup = field(default_factory=ModelGroup)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: EngineGroup = field(default_factory=EngineGroup)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    repeats: int = 1  # timed passes of the workload on one engine, after the warm-up
    reseed_repeats: bool = True  # pass r with workload.seed + r and sampler.seed + r (no prefix cache hits)
    save_outputs: bool | None = None  # outputs.jsonl; null = only for workload=prompts_file
    trial: int = 0  # the interleaved pass this job is (`-m trial=0,1,2 <swept keys>`); the report pools them
    notes: str = ""
    append_to_sweep: bool = False  # a sweep may write into a hydra.sweep.dir holding earlier results

    def __post_init__(self) -> None:
        integer("repeats", self.repeats, 1)
        integer("trial", self.trial, 0)
        if self.profile.trace_steps and self.profile.trace_repeat >= self.repeats:
            allowed = f"a repeat of this job: 0..{self.repeats - 1} (repeats={self.repeats})"
            raise KnobError("profile.trace_repeat", self.profile.trace_repeat, allowed)
        if self.save_outputs is None:  # on for prompts files, whose text matters
            self.save_outputs = self.workload.kind is WorkloadKind.prompts_file
        baseline_only = (  # settings the transformers baseline cannot apply are errors, not labels
            ("parallel.tensor_parallel_size", self.parallel.tensor_parallel_size, 1),
            ("cache.kv_cache_dtype", self.cache.kv_cache_dtype, "auto"),
            ("cache.num_blocks", self.cache.num_blocks, -1),
            ("model.quantization", self.model.quantization, "none"),
        )
        if self.engine.kind is EngineKind.hf and self.workload.kind is WorkloadKind.multi_turn:
            raise KnobError("engine.kind", "hf", "nanoexp with workload=multi_turn (turns follow answers)")
        for knob, value, default in baseline_only if self.engine.kind is EngineKind.hf else ():
            if value != default:
                raise KnobError(knob, value, f"{default!r} with engine=hf (transformers cannot apply it)")


def to_spec(cfg: DictConfig) -> NanoexpConfig:
    """The typed, resolved config; an unknown key or a rejected value is a ConfigError naming the key. A
    deprecated key's value moves to its new key first (with its warning): the logged config has it there."""
    rename_keys(cfg)
    _reject_unknown_keys(cast(dict, OmegaConf.to_container(cfg, resolve=False)), NanoexpConfig, "")
    try:
        return cast(NanoexpConfig, OmegaConf.to_object(cfg))
    except KnobError as e:
        raise ConfigError(str(e)) from None


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain data: what gets logged and what crosses process boundaries."""
    return cast(dict, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def _reject_unknown_keys(values: dict, schema: type, prefix: str) -> None:
    """Keys appended with `+key=value` get past composition; they are errors like misspelled ones."""
    known: dict[str, Any] = {f.name: f.default_factory for f in fields(schema)}
    for key, value in values.items():
        if key not in known:
            allowed = ", ".join(sorted(known))
            raise ConfigError(f"{prefix}{key}: no such config key (allowed here: {allowed})")
        if is_dataclass(known[key]) and isinstance(value, dict):
            _reject_unknown_keys(value, known[key], f"{prefix}{key}.")
