"""The one place where config becomes objects: checkpoint choice, engine, workload, logger.

Everything here that can fail on a bad config fails in `check()` / `resolve_checkpoint()`, cheaply
and with a one-line message naming the config key, before any weights are touched.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nanoexp.config import EngineConfig
from nanoexp.experiment.schema import EngineKind, LoadFormat, LoggerKind, NanoexpConfig, WorkloadKind

log = logging.getLogger(__name__)

# engine kwarg -> config key, to name the key in error messages
CONFIG_KEYS = {
    "device": "engine.device",
    "dtype": "model.dtype",
    "tensor_parallel_size": "parallel.tensor_parallel_size",
    "max_num_seqs": "scheduler.max_num_seqs",
    "max_num_batched_tokens": "scheduler.max_num_batched_tokens",
    "max_model_len": "scheduler.max_model_len",
    "enable_chunked_prefill": "scheduler.enable_chunked_prefill",
    "enforce_eager": "scheduler.enforce_eager",
    "async_scheduling": "scheduler.async_scheduling",
    "gpu_memory_utilization": "cache.gpu_memory_utilization",
    "cpu_kv_cache_gb": "cache.cpu_kv_cache_gb",
    "kvcache_block_size": "cache.block_size",
    "num_kvcache_blocks": "cache.num_blocks",
    "enable_prefix_caching": "cache.enable_prefix_caching",
    "load_format": "model.load_format",
    "attention_backend": "engine.attention_backend",
    "seed": "engine.seed",
}


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Checkpoint:
    load_format: str  # what the engine gets: "safetensors" or "dummy"
    path: str | None  # the checkpoint directory when real weights are used
    requested: str  # model.load_format as configured
    source: str  # "path", "hub_cache" or "none"

    def as_dict(self) -> dict:
        return asdict(self)


def to_spec(cfg: DictConfig) -> NanoexpConfig:
    """The typed, fully resolved config (raises on missing values or bad interpolations)."""
    return OmegaConf.to_object(cfg)


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain data: what gets logged and what crosses process boundaries."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def check(spec: NanoexpConfig) -> None:
    """Cross-group checks plus the engine's own knob validation, without building anything."""
    arch, tp = spec.model.arch, spec.parallel.tensor_parallel_size
    for heads in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(arch, heads)
        if tp < 1 or n % tp:
            allowed = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
            raise ConfigError(
                f"parallel.tensor_parallel_size={tp} does not divide model.arch.{heads}={n} "
                f"of {spec.model.name}: allowed sizes are {allowed}"
            )
    if spec.scheduler.max_model_len > arch.max_position_embeddings:
        raise ConfigError(
            f"scheduler.max_model_len={spec.scheduler.max_model_len} exceeds "
            f"model.arch.max_position_embeddings={arch.max_position_embeddings} of {spec.model.name}"
        )
    _check_workload(spec)
    try:
        EngineConfig.from_kwargs(spec.model.name, **engine_kwargs(spec, None))
    except (TypeError, ValueError) as e:
        raise ConfigError(_name_key(str(e))) from None


def _check_workload(spec: NanoexpConfig) -> None:
    w = spec.workload
    if w.kind is WorkloadKind.prompts_file and not (w.path and Path(w.path).is_file()):
        raise ConfigError(f"workload.path={w.path!r}: no such file (a JSONL or text file of prompts)")
    if w.kind is WorkloadKind.shared_prefix and w.num_prefixes < 1:
        raise ConfigError(f"workload.num_prefixes={w.num_prefixes}: must be >= 1")
    if w.kind is WorkloadKind.latency and w.num_iters < 1:
        raise ConfigError(f"workload.num_iters={w.num_iters}: must be >= 1")


def engine_kwargs(spec: NanoexpConfig, checkpoint: Checkpoint | None) -> dict:
    """`LLM(model, **kwargs)` arguments; `hf_config` only when the weights are dummy."""
    m, c, s, e = spec.model, spec.cache, spec.scheduler, spec.engine
    dummy = checkpoint is None or checkpoint.load_format == "dummy"
    return {
        "device": e.device.value,
        "dtype": m.dtype.value,
        "tensor_parallel_size": spec.parallel.tensor_parallel_size,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_model_len": s.max_model_len,
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "cpu_kv_cache_gb": c.cpu_kv_cache_gb,
        "kvcache_block_size": c.block_size,
        "num_kvcache_blocks": c.num_blocks,
        "enable_prefix_caching": c.enable_prefix_caching,
        "enable_chunked_prefill": s.enable_chunked_prefill,
        "enforce_eager": s.enforce_eager,
        "async_scheduling": s.async_scheduling,
        "load_format": checkpoint.load_format if checkpoint else "dummy",
        "attention_backend": e.attention_backend.value,
        "seed": e.seed,
        "hf_config": arch_dict(spec) if dummy else None,
    }


def arch_dict(spec: NanoexpConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(spec.model.arch))


def resolve_checkpoint(spec: NanoexpConfig) -> Checkpoint:
    """Decide real vs dummy weights: auto falls back to dummy loudly, safetensors never does."""
    m = spec.model
    requested = m.load_format.value
    if m.load_format is LoadFormat.dummy:
        return Checkpoint("dummy", None, requested, "none")
    path, source = find_checkpoint(m.path, m.hub_id)
    if path is not None:
        return Checkpoint("safetensors", path, requested, source)
    where = f"model.path={m.path!r}" if m.path else f"model.hub_id={m.hub_id!r} (local HF cache)"
    if m.load_format is LoadFormat.safetensors:
        raise ConfigError(
            f"{where}: no *.safetensors checkpoint found; model.load_format=safetensors never "
            "falls back (set model.path, download the model, or use model.load_format=auto|dummy)"
        )
    _warn_dummy(m.name, where)
    return Checkpoint("dummy", None, requested, "none")


def find_checkpoint(path: str | None, hub_id: str | None) -> tuple[str | None, str]:
    """A directory with *.safetensors: the local path if given, else the local HF hub cache."""
    if path:
        p = Path(path).expanduser()
        return (str(p), "path") if any(p.glob("*.safetensors")) else (None, "none")
    if hub_id:
        cached = _hub_snapshot(hub_id)
        if cached and any(Path(cached).glob("*.safetensors")):
            return cached, "hub_cache"
    return None, "none"


def _hub_snapshot(hub_id: str) -> str | None:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(hub_id, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError) or an invalid id: both mean "absent"
        return None


def check_arch(spec: NanoexpConfig, checkpoint: Checkpoint) -> list[str]:
    """Fields where the checkpoint's config.json disagrees with model.arch (warned, not fatal)."""
    if checkpoint.path is None:
        return []
    config_file = Path(checkpoint.path) / "config.json"
    if not config_file.is_file():
        return []
    disk = json.loads(config_file.read_text())
    ours = arch_dict(spec)
    diffs = [
        f"{k}: config.json={disk[k]!r} model.arch={v!r}"
        for k, v in ours.items()
        if k in disk and disk[k] != v
    ]
    for d in diffs:
        log.warning("model.arch differs from %s/config.json: %s", checkpoint.path, d)
    return diffs


def build_engine(spec: NanoexpConfig, checkpoint: Checkpoint):
    """Our LLM, or the transformers baseline for engine=hf."""
    if spec.engine.kind is EngineKind.hf:
        from nanoexp.experiment.hf_baseline import HFBaseline

        return HFBaseline(
            arch_dict(spec),
            checkpoint.path,
            spec.model.dtype.value,
            spec.engine.device.value,
            spec.engine.seed,
            spec.scheduler.max_num_seqs,
        )
    from nanoexp import LLM

    model = checkpoint.path or spec.model.name
    return LLM(model, **engine_kwargs(spec, checkpoint))


def build_executor(spec: NanoexpConfig, engine):
    from nanoexp.experiment.driver import StepExecutor

    return engine if spec.engine.kind is EngineKind.hf else StepExecutor(engine.engine)


def build_tokenizer(checkpoint: Checkpoint):
    """The checkpoint's tokenizer (for text prompts); None with dummy weights."""
    if checkpoint.path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint.path)


def build_workload(spec: NanoexpConfig, tokenizer=None):
    from nanoexp.experiment.workloads import WorkloadError, build_workload

    tokenize = (lambda text: tokenizer.encode(text)) if tokenizer is not None else None
    try:
        workload = build_workload(spec.workload, spec.sampler, spec.model.arch.vocab_size, tokenize)
    except (WorkloadError, ValueError) as e:
        raise ConfigError(str(e)) from None
    longest = max(len(r.prompt_token_ids) + r.sampling_params.max_tokens for r in workload.requests)
    if longest > spec.scheduler.max_model_len:
        raise ConfigError(
            f"workload {spec.workload.name} has a request of {longest} tokens (prompt + max_tokens) "
            f"> scheduler.max_model_len={spec.scheduler.max_model_len}"
        )
    return workload


def build_logger(spec: NanoexpConfig):
    """The selected logger fanned out with the always-on local sink."""
    from nanoexp.experiment.local_sink import LocalSink
    from nanoexp.experiment.loggers import FanoutLogger, NoneLogger

    if spec.logger.kind is LoggerKind.wandb:
        from nanoexp.experiment.wandb_logger import WandbLogger

        return FanoutLogger([WandbLogger(spec.logger), LocalSink()])
    return FanoutLogger([NoneLogger(), LocalSink()])


def _name_key(message: str) -> str:
    knob = message.split("=", 1)[0].strip()
    key = CONFIG_KEYS.get(knob)
    return f"{key}: {message}" if key else message


def _warn_dummy(name: str, where: str) -> None:
    bar = "!" * 78
    msg = (
        f"{bar}\n!! {name}: no checkpoint at {where}.\n"
        "!! model.load_format=auto -> using DUMMY (random) weights: throughput and latency are\n"
        "!! meaningful, generated text is not. Set model.path or model.load_format=dummy to silence.\n"
        f"{bar}"
    )
    print(msg, file=sys.stderr)
    log.warning("%s: no checkpoint at %s; using dummy weights", name, where)
