"""A job's parts from its typed config, checked across groups before any weights are touched."""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

from nanoexp.config import KnobError
from nanoexp.config.checkpoint_files import json_object
from nanoexp.config.parallel import check_split
from nanoexp.experiment.schema import (
    DUMMY_IF_MISSING,
    ConfigError,
    LoggerConfig,
    LoggerKind,
    ModelGroup,
    NanoexpConfig,
    WorkloadKind,
)
from nanoexp.experiment.sinks.local import FanoutLogger, LocalSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    load_format: str  # what the engine gets: "safetensors" or "dummy"
    path: str | None  # the checkpoint directory when real weights are used
    requested: str  # model.load_format as configured
    source: str  # "path", "hub_cache" or "none"


def resolve_checkpoint(model: ModelGroup) -> Checkpoint:
    """Real weights from model.path, else from the local HF hub cache (a directory with *.safetensors);
    only dummy_if_missing falls back to dummy weights, loudly."""
    requested = model.load_format
    if requested == "dummy":
        return Checkpoint("dummy", None, requested, "none")
    if model.path:
        path = Path(model.path).expanduser()
        if any(path.glob("*.safetensors")):
            return Checkpoint("safetensors", str(path), requested, "path")
    elif model.hub_id:
        from huggingface_hub import snapshot_download

        with contextlib.suppress(Exception):  # not cached or an invalid id: both mean "absent"
            cached = snapshot_download(model.hub_id, local_files_only=True)
            if any(Path(cached).glob("*.safetensors")):
                return Checkpoint("safetensors", cached, requested, "hub_cache")
    where = f"model.path={model.path!r}" if model.path else f"model.hub_id={model.hub_id!r} (local HF cache)"
    if requested != DUMMY_IF_MISSING:
        raise ConfigError(
            f"{where}: no *.safetensors checkpoint found; model.load_format={requested} never falls back "
            f"(set model.path, download the model, or use model.load_format={DUMMY_IF_MISSING}|dummy)"
        )
    bar = "!" * 78
    print(
        f"{bar}\n!! {model.name}: no checkpoint at {where}.\n"
        f"!! model.load_format={DUMMY_IF_MISSING} -> using DUMMY (random) weights: throughput and\n"
        "!! latency are meaningful, generated text is not. Set model.path, or model.load_format=dummy\n"
        f"!! to silence this.\n{bar}",
        file=sys.stderr,
    )
    log.warning("%s: no checkpoint at %s; using dummy weights", model.name, where)
    return Checkpoint("dummy", None, requested, "none")


def check_arch(model: ModelGroup, checkpoint: Checkpoint) -> list[str]:
    """Fields where the checkpoint's config.json disagrees with model.arch (warned, not fatal)."""
    disk = checkpoint_config(checkpoint)
    arch = model.arch.as_dict().items()
    diffs = [f"{k}: config.json={disk[k]!r} model.arch={v!r}" for k, v in arch if k in disk and disk[k] != v]
    for d in diffs:
        log.warning(
            "model.arch differs from %s/config.json: %s (the checkpoint's value is used)", checkpoint.path, d
        )
    return diffs


def checkpoint_config(checkpoint: Checkpoint) -> dict:
    """The checkpoint's config.json, {} with dummy weights."""
    config_file = Path(checkpoint.path or "") / "config.json"
    if checkpoint.path is None or not config_file.is_file():
        return {}
    return json_object(str(config_file), checkpoint.path)  # a malformed file, named


def adopt_checkpoint_arch(spec: NanoexpConfig, checkpoint: Checkpoint) -> tuple[NanoexpConfig, list[str]]:
    """With real weights the checkpoint's config.json wins wherever the job reads the architecture (the
    engine, the workload's token ids and lengths, the baseline): `model.arch` takes its values, and each
    field that differed is a warning (`summary.arch_mismatches`). Rechecked across groups with them."""
    diffs = check_arch(spec.model, checkpoint)
    if not diffs:
        return spec, diffs
    disk = checkpoint_config(checkpoint)
    changed = {f.name: disk[f.name] for f in fields(spec.model.arch) if f.name in disk}
    spec = replace(spec, model=replace(spec.model, arch=replace(spec.model.arch, **changed)))
    check(spec)
    return spec, diffs


def check(spec: NanoexpConfig) -> None:
    """Rules across groups that need the model's architecture."""
    try:
        parallel = spec.parallel
        check_split(spec.model.arch.as_dict(), parallel.tensor_parallel_size, parallel.expert_parallel)
        spec.scheduler.model_len(spec.model.arch.max_position_embeddings)
    except KnobError as e:
        raise ConfigError(f"{e} (model={spec.model.name})") from None


def build_workload(spec: NanoexpConfig, tokenizer=None):
    from nanoexp.experiment.measure import sessions, traces
    from nanoexp.experiment.measure.workloads import build_workload, request_label, sampling_params

    w, vocab, tokenize = spec.workload, spec.model.arch.vocab_size, tokenizer.encode if tokenizer else None
    own_builders = {
        WorkloadKind.trace: traces.trace_workload,
        WorkloadKind.multi_turn: sessions.multi_turn_workload,
    }
    try:
        if w.kind in own_builders:
            workload = own_builders[w.kind](w, lambda m, i: sampling_params(w, spec.sampler, m, i), vocab)
        else:
            workload = build_workload(w, spec.sampler, vocab, tokenize)
    except ValueError as e:  # ConfigError, or a value SamplingParams rejects
        raise ConfigError(str(e)) from None
    limit = spec.scheduler.model_len(spec.model.arch.max_position_embeddings)
    for index, r in enumerate(workload.requests):
        length = len(r.prompt_token_ids) + r.sampling_params.max_tokens
        if length > limit:
            raise ConfigError(
                f"workload {spec.workload.name}: {request_label(index, r)} has {length} tokens "
                f"(prompt {len(r.prompt_token_ids)} + max_tokens {r.sampling_params.max_tokens}) "
                f"> max_model_len={limit} (scheduler.max_model_len or the model's limit)"
            )
    if (workload.longest or 0) > limit:  # a multi-turn session's later turns carry the conversation
        raise ConfigError(
            f"workload {spec.workload.name}: its longest request grows to {workload.longest} tokens "
            f"(prompt + max_tokens) > max_model_len={limit} (scheduler.max_model_len or the model's limit)"
        )
    return workload


def build_logger(cfg: LoggerConfig) -> FanoutLogger:
    """The local sink always; W&B beside it when the logger section asks for it."""
    if cfg.kind is LoggerKind.wandb:
        from nanoexp.experiment.sinks.wandb_sink import WandbLogger

        return FanoutLogger([WandbLogger(cfg), LocalSink()])
    return FanoutLogger([LocalSink()])
