"""Typed schema of the Hydra config: one dataclass per config group, registered in the ConfigStore.

Every YAML under conf/ is merged into these dataclasses, so a misspelled key or a value of the
wrong type fails at composition, before anything heavy is imported or loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class LoadFormat(Enum):
    auto = "auto"  # real weights when found on disk, else dummy with a loud warning
    safetensors = "safetensors"  # real weights or a one-line error
    dummy = "dummy"  # random weights, no files needed


class DType(Enum):
    auto = "auto"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class Device(Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


class AttentionBackend(Enum):
    auto = "auto"
    torch = "torch"
    triton = "triton"
    flash_attn = "flash_attn"


class EngineKind(Enum):
    nanoexp = "nanoexp"  # our engine, driven step by step
    hf = "hf"  # transformers `generate`, the baseline


class WorkloadKind(Enum):
    random = "random"
    nanovllm_bench = "nanovllm_bench"
    shared_prefix = "shared_prefix"
    prompts_file = "prompts_file"
    latency = "latency"


class LoggerKind(Enum):
    wandb = "wandb"
    none = "none"


@dataclass
class ArchConfig:
    """The architecture fields of the model's config.json (passed to the engine as hf_config)."""

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


@dataclass
class ModelConfig:
    name: str = MISSING
    hub_id: str | None = None  # Hugging Face repo id, looked up in the local hub cache only
    path: str | None = None  # a local checkpoint directory; wins over hub_id
    load_format: LoadFormat = LoadFormat.auto
    dtype: DType = DType.auto
    arch: ArchConfig = field(default_factory=ArchConfig)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


@dataclass
class SamplerConfig:
    name: str = "default"
    temperature: float = 1.0  # 0 = greedy
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None


@dataclass
class CacheConfig:
    block_size: int = 256
    gpu_memory_utilization: float = 0.9
    num_blocks: int = -1  # -1 = as many as memory allows
    enable_prefix_caching: bool = True
    cpu_kv_cache_gb: float = 2.0


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    async_scheduling: bool | None = None  # schedule decode step n+1 while step n runs; null = on at tp1


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
    batch_size: int = 8  # latency: requests per iteration
    num_iters: int = 3  # latency: timed iterations
    num_iters_warmup: int = 1  # latency: untimed iterations


@dataclass
class EngineSelectConfig:
    kind: EngineKind = EngineKind.nanoexp
    device: Device = Device.auto
    attention_backend: AttentionBackend = AttentionBackend.auto
    seed: int = 0
    warmup: bool = True  # one short untimed request before the workload
    use_tqdm: bool = False


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


@dataclass
class LaunchConfig:
    # >0: each job of a local sweep takes its own slice of the visible GPUs, picked by job number
    gpus_per_job: int = 0


@dataclass
class NanoexpConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: EngineSelectConfig = field(default_factory=EngineSelectConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    notes: str = ""


def register_configs() -> None:
    """Register the root schema; conf/config.yaml lists it first so every group merges into it."""
    ConfigStore.instance().store(name="nanoexp_schema", node=NanoexpConfig)


register_configs()
