"""The compact summary table printed at the end of a job (and appended to its run.log)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from nanoexp.config.checks import is_real
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.runtime.job_info import JobInfo

PEAK_KINDS = {"allocated": "allocated", "resident": "resident", "resident_lifetime": "process, resident"}
SHOWN = {  # always in the header, whether or not they differ from the defaults
    "parallel.tensor_parallel_size": "TP",
    "cache.block_size": "block size",
    "workload.request_rate": "rate",
}
BASELINE_UNUSED = ("parallel.tensor_parallel_size", "cache.block_size")  # transformers runs neither
SKIPPED_GROUPS = ("hydra", "experiment")  # experiment presets show as the keys they change


def format_summary(summary: dict, job: JobInfo | None = None, plain: dict | None = None) -> str:
    """The table; its header names the SHOWN settings of the job's resolved config `plain` and every
    setting changed from the defaults."""
    get = lambda k: summary.get(k, "?")
    unused = BASELINE_UNUSED if summary.get("engine_kind") == "hf" else ()
    shown = [f"{SHOWN[k]} {v}" for k, v in flatten(plain or {}).items() if k in SHOWN and k not in unused]
    changed = changed_settings(plain, job.overrides) if plain is not None and job is not None else {}
    lines = [
        f"{get('engine_kind')} | {get('model')} ({get('load_format')} weights) | {get('workload')}",
        ", ".join([*shown, f"attention {get('attention_backend')}"]),
        f"changed from the defaults: {' '.join(f'{k}={v}' for k, v in changed.items()) or 'nothing'}",
    ]
    lines.append("-" * max(len(line) for line in lines))
    for label, keys, fmt, unit in _rows(summary):
        cells = [c for c in (_cell(summary, k, fmt) for k in keys) if c is not None]
        if len(cells) == len(keys):
            lines.append(f"{label:<30}{' / '.join(cells)}{' ' + unit if unit else ''}")
    repeats = summary.get("repeats", 1)
    if isinstance(repeats, int) and repeats > 1:
        note = (
            f"(mean ± 95% CI half-width over {repeats} repeats of one run: within-run noise only, a verdict "
            "needs independent runs; [low, high] where it stops at 0; rates: total over total time)"
        )
        lines.append(f"{'':<30}{note}")
    if job is not None:
        lines.append(f"{'results':<30}{job.out_dir / 'results.json'}")
    return "\n".join(lines)


def _rows(s: dict) -> list[tuple[str, tuple[str, ...], str, str]]:
    """(label, summary keys, number format, unit) of each row; memory and start-up rows show only what ran."""
    memory = ("weights_bytes", "kv_cache_bytes")[: 1 + (s.get("kv_cache_bytes", 0) > 0)]  # hf: no KV cache
    peak = PEAK_KINDS.get(s.get("peak_memory_kind", ""))
    tp = int(s.get("tensor_parallel_size", 1) or 1)
    ranks = ", rank 0" if tp > 1 else ""  # each rank holds its share; the total is its own row
    start = [("load", "load_s"), *[("warm-up", "warmup_s")] * (s.get("warmup_s", 0) > 0)]
    start += [("graphs", "graph_capture_s")] * bool(s.get("cuda_graphs"))
    return [
        ("requests", ("completed",), "{:.0f}", ""),
        ("input / output tokens", ("total_input_tokens", "total_output_tokens"), "{:.0f}", ""),
        ("duration", ("duration_s",), "{:.2f}", "s"),
        ("output throughput", ("output_throughput",), "{:.1f}", "tok/s"),
        ("total throughput", ("total_token_throughput",), "{:.1f}", "tok/s"),
        ("offered / achieved rate", ("offered_request_rate", "request_throughput"), "{:.2f}", "req/s"),
        ("request goodput", ("request_goodput",), "{:.2f}", "req/s"),
        ("SLO attainment", ("slo_attainment",), "{:.1%}", ""),
        ("TTFT mean / p99", ("mean_ttft_ms", "p99_ttft_ms"), "{:.1f}", "ms"),
        ("TPOT mean / p99", ("mean_tpot_ms", "p99_tpot_ms"), "{:.2f}", "ms"),
        ("ITL mean / p99", ("mean_itl_ms", "p99_itl_ms"), "{:.2f}", "ms"),
        ("E2E mean / p99", ("mean_e2el_ms", "p99_e2el_ms"), "{:.1f}", "ms"),
        ("iteration latency mean / p99", ("mean_latency_ms", "p99_latency_ms"), "{:.1f}", "ms"),
        ("prefix cache hit rate", ("prefix_cache_hit_rate",), "{:.1%}", ""),
        ("preemptions", ("num_preemptions",), "{:.0f}", ""),
        (("weights / KV cache" if len(memory) > 1 else "weights") + ranks, memory, "{:.3g}", "GB"),
        (
            f"peak memory ({peak}){ranks}" if peak else f"peak memory{ranks}",
            ("peak_memory_bytes",),
            "{:.3g}",
            "GB",
        ),
        *[(f"peak memory, all {tp} ranks", ("peak_memory_bytes_total",), "{:.3g}", "GB")] * (tp > 1),
        (" / ".join(name for name, _ in start), tuple(key for _, key in start), "{:.2f}", "s"),
        *[("warm-up request", ("bench_warmup_s",), "{:.2f}", "s")] * (s.get("bench_warmup_s", 0) > 0),
        ("KV cache greedy agreement", ("kv_quality/greedy_agreement",), "{:.2%}", ""),
        (
            "KV cache KL mean / p99 / max",
            tuple(f"kv_quality/kl_{k}" for k in ("mean", "p99", "max")),
            "{:.3g}",
            "nats",
        ),
        ("weights greedy agreement", ("weight_quality/greedy_agreement",), "{:.2%}", ""),
        (
            "weights KL mean / p99 / max",
            tuple(f"weight_quality/kl_{k}" for k in ("mean", "p99", "max")),
            "{:.3g}",
            "nats",
        ),
    ]


def _cell(summary: dict, key: str, fmt: str) -> str | None:
    """The value with its CI where the summary has one, bytes in GB; None where it was not measured."""
    value, low, high = (summary.get(k) for k in (key, f"{key}_ci95_low", f"{key}_ci95_high"))
    if not is_real(value) or math.isnan(value):
        return None
    scale = registry.unit(key)[1]
    text = fmt.format(value / scale)
    if is_real(low) and is_real(high) and not (math.isnan(low) or math.isnan(high)):
        text += interval_suffix(value / scale, low / scale, high / scale, fmt.format)
    return text


def interval_suffix(value: float, low: float, high: float, fmt: Callable[[float], str]) -> str:
    """` ± half-width` for an interval centred on the value, else ` [low, high]` (cut at a bound)."""
    if math.isclose(value - low, high - value, rel_tol=1e-6, abs_tol=1e-12):
        return f" ± {fmt((high - low) / 2)}"
    return f" [{fmt(low)}, {fmt(high)}]"


def changed_settings(plain: dict, overrides: list[str]) -> dict[str, Any]:
    """The settings that differ from conf/config.yaml's (the command-line overrides outside a Hydra app)."""

    def choices(found) -> dict[str, str]:
        chosen = dict(found).items()
        return {g: str(o) for g, o in chosen if o is not None and not g.startswith(SKIPPED_GROUPS)}

    try:  # compose and HydraConfig.get raise outside a Hydra app
        defaults = choices(compose(config_name="config", return_hydra_config=True).hydra.runtime.choices)
        current = choices(HydraConfig.get().runtime.choices)
        changed = {g: o for g, o in current.items() if defaults.get(g) != o}
        composed = compose(config_name="config", overrides=[f"{g}={o}" for g, o in changed.items()])
        baseline = flatten(cast(dict, OmegaConf.to_container(composed, resolve=True, enum_to_str=True)))
    except Exception:  # noqa: BLE001 - a summary never fails a job
        return dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith("hydra"))
    plain = {k: v for k, v in flatten(plain).items() if not k.startswith("resolved.")}
    return changed | {k: v for k, v in plain.items() if baseline.get(k) != v}


def flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        out |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out
