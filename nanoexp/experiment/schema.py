"""The typed Hydra config: the engine's config classes as groups, plus the experiment-only groups.
OmegaConf checks each field's type (bool, int, enum) as it composes; `__post_init__` checks ranges."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from nanoexp.config import (
    CacheConfig,
    ExecutionConfig,
    KnobError,
    ModelConfig,
    ParallelConfig,
    SamplingParams,
    SchedulerConfig,
)
from nanoexp.config.aliases import rename_keys
from nanoexp.config.checks import MAX_INT64, choice, integer, is_int, is_number, is_real, number
from nanoexp.config.model import LOAD_FORMATS
from nanoexp.experiment.metrics import registry

DUMMY_IF_MISSING = "dummy_if_missing"
NAME_MAX = 200  # bytes of a job dir name; file systems allow 255


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""


class EngineKind(Enum):
    nanoexp = "nanoexp"  # our engine, driven step by step
    hf = "hf"  # transformers `generate`, the baseline


class WorkloadKind(Enum):
    random = "random"
    nanovllm_bench = "nanovllm_bench"
    shared_prefix = "shared_prefix"
    prompts_file = "prompts_file"
    latency = "latency"
    trace = "trace"  # timestamps and lengths of a production trace (nanoexp/experiment/measure/traces.py)
    sharegpt = "sharegpt"  # conversations of a ShareGPT-format dataset (datasets.py)
    multi_turn = "multi_turn"  # closed-loop chat sessions (sessions.py)


class LoggerKind(Enum):
    wandb = "wandb"
    none = "none"


@dataclass
class ArchConfig:
    """The architecture fields of the model's config.json (the engine's `model.arch` with dummy weights)."""

    architectures: list[str] = MISSING
    model_type: str = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    vocab_size: int = MISSING
    max_position_embeddings: int = MISSING
    rope_theta: float = MISSING
    rms_norm_eps: float = MISSING
    tie_word_embeddings: bool = MISSING
    attention_bias: bool = MISSING
    hidden_act: str = "silu"
    bos_token_id: int = MISSING
    eos_token_id: int = MISSING
    # Qwen3-MoE only (None: absent from the model's config)
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool | None = None
    decoder_sparse_step: int | None = None
    mlp_only_layers: list[int] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config.json fields the model has (those left None are not its own)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ModelSpec(ModelConfig):
    """The engine's ModelConfig plus a name, a hub id and a typed `arch`; `load_format` has one more
    value, the default `dummy_if_missing`: dummy weights, loudly, when no checkpoint is found."""

    load_formats: ClassVar[tuple[str, ...]] = (*LOAD_FORMATS, DUMMY_IF_MISSING)

    name: str = MISSING
    hub_id: str | None = None  # Hugging Face repo id, looked up in the local hub cache only
    arch: ArchConfig = field(default_factory=ArchConfig)  # type: ignore[assignment]  # typed for Hydra
    load_format: str = DUMMY_IF_MISSING


@dataclass
class EngineSpec(ExecutionConfig):
    """The engine's ExecutionConfig plus which engine runs the workload and how the job drives it."""

    kind: EngineKind = EngineKind.nanoexp
    warmup: bool = True  # one short untimed request before the workload
    use_tqdm: bool = True  # a progress line while the workload runs (only on a terminal)
    reuse: bool = True  # a sweep's next job reuses this engine when its engine settings are equal


@dataclass
class SamplerConfig:
    """The sampling knobs a workload's requests share; checked by building a SamplingParams."""

    name: str = "default"
    temperature: float = SamplingParams.temperature
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    seed: int | None = SamplingParams.seed  # request i gets seed + i

    def __post_init__(self) -> None:
        try:
            SamplingParams(**self.knobs())
        except KnobError as e:
            raise KnobError("sampler." + e.knob.rsplit(".", 1)[-1], e.value, e.allowed) from None

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}


Check = tuple[Callable[[object], bool], str]  # (accepts the value?, what is allowed)
POSITIVE_INT: Check = (lambda v: is_int(v) and v >= 1, "an integer >= 1")
COUNT_INT: Check = (lambda v: is_int(v) and v >= 0, "an integer >= 0")
RATIO: Check = (lambda v: is_real(v) and 0 <= v < 1, "a number in [0, 1)")
BENCH_LEN: Check = (lambda v: is_int(v) and v >= 100, "an integer >= 100 (bench.py draws in [100, it])")
ARRIVALS: dict[str, Check] = {  # request_rate: a slower one overflows the clock (1e-300: arrivals at 1e300 s)
    "seed": (lambda v: is_int(v) and 0 <= v <= MAX_INT64, f"an integer in [0, {MAX_INT64}]"),
    "request_rate": (lambda v: is_real(v) and v >= 1e-3, "a number >= 0.001 requests/s (.inf = offline)"),
    "burstiness": (lambda v: is_number(v) and 1e-3 <= v <= 1e3, "a number in [0.001, 1000] (1 = Poisson)"),
    "max_concurrency": (lambda v: v is None or POSITIVE_INT[0](v), "null (unlimited) or an integer >= 1"),
}
RANDOM: dict[str, Check] = dict.fromkeys(("num_requests", "input_len", "output_len"), POSITIVE_INT) | {
    "range_ratio": RATIO,
    "output_range_ratio": (lambda v: v is None or RATIO[0](v), "null or a number in [0, 1)"),
}
TRACE_FORMATS = ("auto", "azure", "burstgpt", "mooncake")
RAMPS = ("none", "linear", "exponential")
ALL_OR_COUNT: Check = (lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (all) or an integer >= 1")
SECONDS: Check = (lambda v: is_number(v) and v >= 0, "a number >= 0 (seconds)")
RAMP: dict[str, Check] = {
    "ramp": (lambda v: v in RAMPS, f"one of {', '.join(RAMPS)}"),
    "ramp_end_rate": (lambda v: v is None or (is_number(v) and v >= 1e-3), "null or a number >= 0.001"),
}
FIELDS_BY_KIND: dict[WorkloadKind, dict[str, Check]] = {  # the fields each kind uses
    WorkloadKind.random: RANDOM,
    WorkloadKind.shared_prefix: RANDOM | {"prefix_len": POSITIVE_INT, "num_prefixes": POSITIVE_INT},
    WorkloadKind.latency: dict.fromkeys(("batch_size", "input_len", "output_len", "num_iters"), POSITIVE_INT)
    | {"num_iters_warmup": COUNT_INT},
    WorkloadKind.nanovllm_bench: {"num_requests": POSITIVE_INT}
    | dict.fromkeys(("input_len", "output_len"), BENCH_LEN),
    WorkloadKind.prompts_file: {
        "num_requests": (lambda v: is_int(v) and (v == -1 or v >= 1), "-1 (all prompts) or an integer >= 1"),
        "output_len": POSITIVE_INT,
    },
    WorkloadKind.trace: {
        "format": (lambda v: v in TRACE_FORMATS, f"one of {', '.join(TRACE_FORMATS)}"),
        "num_requests": ALL_OR_COUNT,
        "time_scale": (lambda v: is_number(v) and v > 0, "a number > 0 (2 = the trace at half its rate)"),
        "start_s": SECONDS,
        "trace_block_size": POSITIVE_INT,
    },
    WorkloadKind.sharegpt: {"num_requests": POSITIVE_INT, "min_len": COUNT_INT}
    | dict.fromkeys(("max_input_len", "max_total_len"), POSITIVE_INT),
    WorkloadKind.multi_turn: dict.fromkeys(
        ("num_sessions", "num_turns", "input_len", "output_len"), POSITIVE_INT
    )
    | {"range_ratio": RATIO, "prefix_len": COUNT_INT, "think_time_s": SECONDS},
}
FILE_KINDS = {  # the kinds that read workload.path, and what it must be
    WorkloadKind.prompts_file: "a readable file (JSONL or text, one prompt a line)",
    WorkloadKind.trace: "a readable trace file (Azure or BurstGPT CSV, Mooncake JSONL)",
    WorkloadKind.sharegpt: "a readable ShareGPT-format JSON file",
}


def length_range(length: int, ratio: float) -> tuple[int, int]:
    """Lengths uniform in [len * (1 - r), len * (1 + r)] (vLLM's random dataset)."""
    return int(length * (1 - ratio)), int(length * (1 + ratio))


@dataclass
class WorkloadConfig:
    """One schema for all workloads; `kind` says which fields apply (see conf/workload/*.yaml)."""

    name: str = MISSING
    kind: WorkloadKind = WorkloadKind.random
    seed: int = 0
    num_requests: int = 8
    input_len: int = 128  # random: mean prompt length; shared_prefix: suffix length
    output_len: int = 32
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    output_range_ratio: float | None = None  # unset = range_ratio
    prefix_len: int = 0  # shared_prefix: tokens shared by every request of a group
    num_prefixes: int = 1  # shared_prefix: number of distinct prefixes
    path: str | None = None  # prompts_file: JSONL ({"prompt"|"prompt_token_ids", "max_tokens"}) or text
    ignore_eos: bool = True
    temperature: float | None = None  # set = pins the temperature (nanovllm_bench: 0.6)
    request_rate: float = float("inf")  # requests/s; inf = all at t0 (offline)
    burstiness: float = 1.0  # gamma shape of inter-arrival times; 1 = Poisson
    max_concurrency: int | None = None  # most requests in the engine at once; null = unlimited
    batch_size: int = 8  # latency: requests per iteration (vllm bench latency's defaults, as the next two)
    num_iters: int = 30  # latency: timed iterations
    num_iters_warmup: int = 10  # latency: untimed iterations
    format: str = "auto"  # trace: azure, burstgpt or mooncake (auto: from the file's header)
    time_scale: float = 1.0  # trace: its inter-arrival times times this (2 = half its rate)
    start_s: float = 0.0  # trace: skip its first start_s seconds (the window starts there)
    model_filter: str | None = None  # trace, burstgpt: only the rows of this Model (ChatGPT, GPT-4)
    trace_block_size: int = 512  # trace, mooncake: tokens per hash_ids block
    min_len: int = 4  # sharegpt: drop conversations whose prompt or output is shorter
    max_input_len: int = 1024  # sharegpt: ... or whose prompt is longer
    max_total_len: int = 2048  # sharegpt: ... or whose prompt + output is longer
    num_sessions: int = 8  # multi_turn: sessions, started at request_rate
    num_turns: int = 4  # multi_turn: turns per session
    think_time_s: float = 0.0  # multi_turn: mean (exponential) pause between an answer and the next turn
    ramp: str = "none"  # arrivals' rate from request_rate to ramp_end_rate: none, linear or exponential
    ramp_end_rate: float | None = None

    def __post_init__(self) -> None:  # checks every field the workload's kind uses; reports the first bad one
        for name, (ok, allowed) in (ARRIVALS | FIELDS_BY_KIND[WorkloadKind(self.kind)]).items():
            value = getattr(self, name)
            if not ok(value):
                raise KnobError(f"workload.{name}", value, allowed)
        if self.kind in (WorkloadKind.random, WorkloadKind.shared_prefix):  # a 0-token range is an error
            out_ratio = "range_ratio" if self.output_range_ratio is None else "output_range_ratio"
            for name, ratio_name in (("input_len", "range_ratio"), ("output_len", out_ratio)):
                length, ratio = getattr(self, name), getattr(self, ratio_name)
                if length_range(length, ratio)[0] < 1:
                    allowed = f"small enough that {name}={length} * (1 - {ratio_name}) >= 1"
                    raise KnobError(f"workload.{ratio_name}", ratio, allowed)
        self._check_ramp()
        readable = self.path and Path(self.path).is_file() and os.access(self.path, os.R_OK)
        if WorkloadKind(self.kind) in FILE_KINDS and not readable:
            raise KnobError("workload.path", self.path, FILE_KINDS[WorkloadKind(self.kind)])

    def _check_ramp(self) -> None:
        for name, (ok, allowed) in RAMP.items():
            if not ok(getattr(self, name)):
                raise KnobError(f"workload.{name}", getattr(self, name), allowed)
        if self.ramp == "none":
            return
        if WorkloadKind(self.kind) in (WorkloadKind.trace, WorkloadKind.latency):
            raise KnobError(
                "workload.ramp", self.ramp, f"none with workload.kind={WorkloadKind(self.kind).value}"
            )
        if math.isinf(self.request_rate) or self.ramp_end_rate is None:
            allowed = "none unless workload.request_rate and workload.ramp_end_rate are finite rates"
            raise KnobError("workload.ramp", self.ramp, allowed)


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.wandb
    project: str = "nanoexp"
    entity: str | None = None
    group: str | None = None  # default: the sweep directory's name in multirun, none otherwise
    name: str | None = None  # default: the job's overrides
    tags: list[str] = field(default_factory=list)
    log_every_n_steps: int = 1
    upload_results: bool = True  # results.json as a W&B artifact

    def __post_init__(self) -> None:
        integer("logger.log_every_n_steps", self.log_every_n_steps, 1)


@dataclass
class LaunchConfig:
    # >0: each job of a local sweep takes its own slice of the visible GPUs, picked by job number
    gpus_per_job: int = 0

    def __post_init__(self) -> None:
        integer("launch.gpus_per_job", self.gpus_per_job, 0)


@dataclass
class SloConfig:
    """Service-level objectives as vLLM's `--goodput`: a request is good when it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    attainment: float = 0.9  # a load meets the SLOs when this share of its requests does (capacity search)

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            number(f"metrics.slo.{name}", value, lambda v: v > 0, "null or a number > 0 (milliseconds)")
        number("metrics.slo.attainment", self.attainment, lambda v: 0 < v <= 1, "a number in (0, 1]")

    def as_dict(self) -> dict[str, float]:
        """The latency limits that are set (ms), by metric."""
        return {k: v for k, v in vars(self).items() if v is not None and k != "attainment"}


@dataclass
class KvQualityConfig:
    """The KV-cache quality probe: `num_requests` prompts (0 = off), `num_tokens` greedy tokens each."""

    num_requests: int = 4
    num_tokens: int = 8
    lossless: bool = False

    def __post_init__(self) -> None:
        integer("metrics.kv_quality.num_requests", self.num_requests, 0, " (0 = off)")
        integer("metrics.kv_quality.num_tokens", self.num_tokens, 1)


# Measured (README, Statistics; experiments/verdicts/): other load above this many cores in a repeat
# costs a 2-core CPU job more than its run-to-run noise; a repeat shorter than MIN_DURATION_S on a device
# does not repeat within ~5% from one run to the next.
BUSY_CORES = 0.15
MIN_DURATION_S = {"cpu": 1.0, "cuda": 0.5}


@dataclass
class WeightQualityConfig:
    """What quantized weights cost in accuracy (model.quantization != none, an unquantized checkpoint):
    `num_requests` prompts (0 = off), each continued `num_tokens` greedy tokens by the job's engine and
    scored against the unquantized model (KV cache in the model dtype) on the same tokens."""

    num_requests: int = 4
    num_tokens: int = 8

    def __post_init__(self) -> None:
        integer("metrics.weight_quality.num_requests", self.num_requests, 0, " (0 = off)")
        integer("metrics.weight_quality.num_tokens", self.num_tokens, 1)


@dataclass
class NoiseConfig:
    """When a job is flagged noisy: other load above `busy_cores` in a repeat (the job is then shown but
    used for no verdict), a repeat shorter than `min_duration_s` (null: the device's, MIN_DURATION_S),
    or a CI wider than `max_ci_share`. Both numbers are measured: README, Statistics."""

    busy_cores: float = BUSY_CORES
    max_ci_share: float = 0.1
    min_duration_s: float | None = None

    def __post_init__(self) -> None:
        number("metrics.noise.busy_cores", self.busy_cores, lambda v: v >= 0, "a number >= 0 (cores)")
        number("metrics.noise.max_ci_share", self.max_ci_share, lambda v: v > 0, "a number > 0 (0.1 = 10%)")
        if self.min_duration_s is not None:
            number(
                "metrics.noise.min_duration_s",
                self.min_duration_s,
                lambda v: v >= 0,
                "null or a number >= 0 (s)",
            )

    def min_duration(self, device: str) -> float:
        if self.min_duration_s is not None:
            return self.min_duration_s
        return MIN_DURATION_S.get(device, MIN_DURATION_S["cpu"])


@dataclass
class MetricsConfig:
    slo: SloConfig = field(default_factory=SloConfig)
    kv_quality: KvQualityConfig = field(default_factory=KvQualityConfig)
    weight_quality: WeightQualityConfig = field(default_factory=WeightQualityConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)


# the job summary's metrics a search can optimize (metric_registry: metrics.summarize, kv_quality, latency)
SEARCH_OBJECTIVES = tuple(registry.names(registry.SEARCH))


@dataclass
class SearchConfig:
    """What run.py returns to a search sweeper (see main.objective_of)."""

    objective: str = "output_throughput"
    max_p99_ttft_ms: float | None = None
    infeasible_value: float | None = None  # null: the objective's worst (0 for a rate, 1e18 for a latency)

    def __post_init__(self) -> None:
        choice("search.objective", self.objective, SEARCH_OBJECTIVES)
        if self.infeasible_value is not None:
            number(
                "search.infeasible_value", self.infeasible_value, lambda v: True, "null or a finite number"
            )
        if self.max_p99_ttft_ms is not None:
            number("search.max_p99_ttft_ms", self.max_p99_ttft_ms, lambda v: v > 0, "null or a number > 0")


@dataclass
class CapacityConfig:
    """The capacity search (experiment=capacity, capacity.py): the highest offered rate meeting the SLOs."""

    enabled: bool = False
    start_rate: float = 4.0  # the first probe (requests/s; sessions/s for multi_turn)
    growth: float = 2.0  # bracketing: the rate times (or divided by) this until the SLOs flip
    precision: float = 0.1  # bisection stops when (failing - passing) / passing <= this
    max_probes: int = 16
    min_rate: float = 0.01  # the search gives up below this rate (nothing meets the SLOs) ...
    max_rate: float = 10000.0  # ... or above this one (everything does)

    def __post_init__(self) -> None:
        positive = lambda v: v > 0
        number("capacity.start_rate", self.start_rate, positive, "a number > 0 (requests/s)")
        number("capacity.growth", self.growth, lambda v: v > 1, "a number > 1")
        number("capacity.precision", self.precision, lambda v: 0 < v < 1, "a number in (0, 1) (0.1 = 10%)")
        integer("capacity.max_probes", self.max_probes, 2)
        number(
            "capacity.min_rate",
            self.min_rate,
            lambda v: 1e-3 <= v <= self.start_rate,
            "in [0.001, start_rate]",
        )
        number("capacity.max_rate", self.max_rate, lambda v: v >= self.start_rate, "a number >= start_rate")


@dataclass
class ProfileConfig:
    """What to profile in the timed passes (experiment/profiling.py); off, it costs nothing."""

    trace_steps: int = 0  # a torch profiler Chrome trace of this many timed steps (0 = none)
    trace_first_step: int = 0  # the first traced step, counted from the start of the pass
    trace_repeat: int = 0  # the pass (repeat) traced
    host_phases: bool = False  # the host's time per step phase, as host_*_ms columns of steps.csv
    events: bool = False  # Triton compiles, torch.compile graphs, garbage collections per timed step

    def __post_init__(self) -> None:
        integer("profile.trace_steps", self.trace_steps, 0, " (0 = no trace)")
        integer("profile.trace_first_step", self.trace_first_step, 0)
        integer("profile.trace_repeat", self.trace_repeat, 0)

    @property
    def enabled(self) -> bool:
        return bool(self.trace_steps or self.host_phases or self.events)


@dataclass
class ReportConfig:
    """Summary keys the sweep report shows beside its main metrics (by default, step aggregates)."""

    metrics: list[str] = field(
        default_factory=lambda: [
            "prefill_time_s",
            "decode_time_s",
            "prefix_cache_hit_rate",
            "peak_kv_blocks_used",
            "num_preemptions",
        ]
    )


@dataclass
class NanoexpConfig:
    model: ModelSpec = field(default_factory=ModelSpec)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: EngineSpec = field(default_factory=EngineSpec)
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


def safe_dir_name(name: str) -> str:
    """A job dir name that stays one path component (`/` is %2F) and fits the file system (cut, hashed)."""
    name = name.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    encoded = name.encode()
    if len(encoded) <= NAME_MAX:
        return name
    return encoded[: NAME_MAX - 13].decode(errors="ignore") + "~" + hashlib.sha1(encoded).hexdigest()[:12]


JOB_NUM_OFFSET = "NANOEXP_JOB_NUM_OFFSET"  # set by the sweep callback: jobs appended to a sweep come after


def job_number(num: int | str) -> int:
    """A job's number in its sweep dir: Hydra's, after the jobs an earlier sweep left there (append_to_sweep),
    so an appended job never takes (and overwrites) an earlier job's dir."""
    return int(num) + int(os.environ.get(JOB_NUM_OFFSET, "0") or 0)


# the root schema (conf/config.yaml lists it first) and the resolver of hydra.sweep.subdir
ConfigStore.instance().store(name="nanoexp_schema", node=NanoexpConfig)
OmegaConf.register_new_resolver("nanoexp_dir_name", safe_dir_name, replace=True)
OmegaConf.register_new_resolver("nanoexp_job_num", lambda num: job_number(num), replace=True)
