"""Which weights a job runs: a local checkpoint, the local hub cache, or dummy (random) weights."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from nanoexp.config.checkpoint_files import json_object
from nanoexp.experiment.schema import DUMMY_IF_MISSING, ConfigError, ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    load_format: str  # what the engine gets: "safetensors" or "dummy"
    path: str | None  # the checkpoint directory when real weights are used
    requested: str  # model.load_format as configured
    source: str  # "path", "hub_cache" or "none"


def arch_dict(model: ModelSpec) -> dict:
    """model.arch as the plain config.json fields the engine and transformers take."""
    return OmegaConf.to_container(OmegaConf.structured(model.arch))


def resolve_checkpoint(model: ModelSpec) -> Checkpoint:
    """Real or dummy weights: only dummy_if_missing falls back to dummy weights, loudly."""
    requested = model.load_format
    if requested == "dummy":
        return Checkpoint("dummy", None, requested, "none")
    path, source = find_checkpoint(model.path, model.hub_id)
    if path is not None:
        return Checkpoint("safetensors", path, requested, source)
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


def find_checkpoint(path: str | None, hub_id: str | None) -> tuple[str | None, str]:
    """A directory with *.safetensors: the local path if given, else the local HF hub cache."""
    if path:
        p = Path(path).expanduser()
        return (str(p), "path") if any(p.glob("*.safetensors")) else (None, "none")
    if hub_id:
        from huggingface_hub import snapshot_download

        try:
            cached = snapshot_download(hub_id, local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached or an invalid id: both mean "absent"
            cached = None
        if cached and any(Path(cached).glob("*.safetensors")):
            return cached, "hub_cache"
    return None, "none"


def check_arch(model: ModelSpec, checkpoint: Checkpoint) -> list[str]:
    """Fields where the checkpoint's config.json disagrees with model.arch (warned, not fatal)."""
    config_file = Path(checkpoint.path or "") / "config.json"
    if checkpoint.path is None or not config_file.is_file():
        return []
    disk = json_object(str(config_file), checkpoint.path)  # a malformed file, named
    arch = arch_dict(model).items()
    diffs = [f"{k}: config.json={disk[k]!r} model.arch={v!r}" for k, v in arch if k in disk and disk[k] != v]
    for d in diffs:
        log.warning("model.arch differs from %s/config.json: %s", checkpoint.path, d)
    return diffs
