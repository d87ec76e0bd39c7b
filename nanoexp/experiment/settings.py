"""The settings of a job that differ from the defaults (conf/config.yaml), for the summary header
and run.log: group options first (`model=qwen3_tiny`), then every key whose value differs from what
those options give (`cache.block_size=64`, including what an `experiment=` preset changed)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

SKIPPED_GROUPS = ("hydra", "experiment")  # experiment presets show as the keys they change
SKIPPED_KEYS = ("resolved.",)  # what the job resolved at run time, not a setting


def changed_settings(plain: dict, overrides: list[str]) -> dict[str, Any]:
    """`plain` is the job's resolved config. Outside a Hydra app, or if the defaults cannot be
    composed again, the command-line `overrides` stand in (a summary never fails a job)."""
    try:
        return _changed(plain)
    except Exception:  # noqa: BLE001 - see the docstring
        return dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("hydra"))


def _changed(plain: dict) -> dict[str, Any]:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if not (HydraConfig.initialized() and GlobalHydra.instance().is_initialized()):
        raise RuntimeError("not in a Hydra app")
    choices = _choices(HydraConfig.get().runtime.choices)
    default_choices = _choices(_compose([], hydra=True).hydra.runtime.choices)
    changed = {g: o for g, o in choices.items() if default_choices.get(g) != o}
    baseline = _compose([f"{g}={o}" for g, o in changed.items()])
    baseline = flatten(OmegaConf.to_container(baseline, resolve=True, enum_to_str=True))
    keys = {
        k: v for k, v in flatten(plain).items() if not k.startswith(SKIPPED_KEYS) and baseline.get(k) != v
    }
    return changed | keys


def flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def always_shown(plain: dict) -> dict[str, Any]:
    """TP size, block size and request rate, whatever their values."""
    flat = flatten(plain)
    keys = ("parallel.tensor_parallel_size", "cache.block_size", "workload.request_rate")
    return {k: flat[k] for k in keys if k in flat}


def _choices(choices) -> dict[str, str]:
    return {g: str(o) for g, o in dict(choices).items() if not g.startswith(SKIPPED_GROUPS) and o is not None}


def _compose(overrides: list[str], hydra: bool = False):
    from hydra import compose

    return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)
