"""Every metric the experiment layer reports, in one table: its unit, which direction is better, whether it
is a headline (a spread over repeats and trials), how it is printed, and the engines it applies to. The
summary, repeats, sweep report and plots, compare, W&B and the search objective read it; adding a metric
is one row of METRICS (a latency series is one row of LATENCY_SERIES)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

HIGHER, LOWER = "higher", "lower"
ENGINES = frozenset({"nanoexp", "hf"})
NANOEXP_ONLY = frozenset({"nanoexp"})  # KV blocks, prefix cache, preemptions: transformers has none
GB, GIB = 1e9, 2**30


@dataclass(frozen=True)
class Metric:
    name: str  # the results.json summary key
    label: str  # in words, for titles and table headers
    unit: str = ""  # what the displayed number is in ("GB" values are bytes, shown / 1e9)
    better: str | None = None  # HIGHER, LOWER or None (neither: a count, a setting)
    headline: bool = False  # gets `_std` and `_ci95_low/high` over repeats, and over trials in a sweep
    fmt: str = ",.4g"  # format spec of the displayed value
    scale: float = 1.0  # displayed value = value / scale
    engines: frozenset[str] = ENGINES  # where it applies; elsewhere it is absent (NA), never 0
    roles: frozenset[str] = field(default_factory=frozenset)  # lists it belongs to (see ROLES)

    def display(self, value: float) -> str:
        return format(value / self.scale, self.fmt)

    def title(self) -> str:
        """`p99 TTFT (ms)`, `peak memory (GB)`: a panel title or a column header."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def direction_words(self) -> str:
        return {HIGHER: "higher is better", LOWER: "lower is better"}.get(self.better or "", "")


# the lists a metric can belong to: the sweep table, its plots, compare's default, the noise check of a
# job's CIs (repeats.noise_flags), the keys a search may optimize (search.objective)
TABLE, PLOT, COMPARE, CI_CHECK, SEARCH = "table", "plot", "compare", "ci_check", "search"
ROLES = (TABLE, PLOT, COMPARE, CI_CHECK, SEARCH)


def _m(name: str, label: str, unit: str = "", better: str | None = None, *roles: str, **kw) -> Metric:
    return Metric(name, label, unit, better, roles=frozenset(roles), **kw)


LATENCY_SERIES = {  # series -> (words, unit); each has mean/median/std/p90/p99 (metrics.distribution)
    "ttft_ms": ("TTFT", "ms"),
    "tpot_ms": ("TPOT", "ms"),
    "itl_ms": ("ITL", "ms"),
    "e2el_ms": ("end-to-end latency", "ms"),
}
LATENCY_STATS = ("mean", "median", "std", "p90", "p99")
HEADLINE_STATS = ("mean", "median", "p99")
ITERATION_PERCENTILES = (10, 25, 50, 75, 90, 99)  # as `vllm bench latency`
# (series, stat) -> roles beyond SEARCH, which every latency statistic has
LATENCY_ROLES = {
    ("ttft_ms", "mean"): (TABLE, PLOT, COMPARE, CI_CHECK),
    ("ttft_ms", "p99"): (TABLE, PLOT, COMPARE),
    ("tpot_ms", "mean"): (TABLE, PLOT, COMPARE, CI_CHECK),
    ("itl_ms", "p99"): (TABLE, PLOT),
    ("e2el_ms", "mean"): (TABLE, PLOT, COMPARE, CI_CHECK),
}

METRICS: list[Metric] = [
    _m("offered_request_rate", "offered request rate", "req/s", None, TABLE, fmt=",.4g"),
    _m(
        "output_throughput",
        "output throughput",
        "tok/s",
        HIGHER,
        TABLE,
        PLOT,
        COMPARE,
        CI_CHECK,
        SEARCH,
        headline=True,
        fmt=",.0f",
    ),
    _m(
        "total_token_throughput",
        "total token throughput",
        "tok/s",
        HIGHER,
        TABLE,
        PLOT,
        SEARCH,
        headline=True,
        fmt=",.0f",
    ),
    _m("request_throughput", "achieved request rate", "req/s", HIGHER, TABLE, SEARCH, headline=True),
    _m("request_goodput", "request goodput", "req/s", HIGHER, TABLE, PLOT, SEARCH, headline=True),
    _m(
        "slo_attainment",
        "SLO attainment",
        "fraction of requests",
        HIGHER,
        TABLE,
        SEARCH,
        headline=True,
        fmt=".1%",
    ),
    _m("duration_s", "duration", "s", LOWER, TABLE, COMPARE, SEARCH, headline=True, fmt=",.3g"),
    *[
        _m(
            f"{stat}_{series}",
            f"{stat} {words}",
            unit,
            LOWER,
            SEARCH,
            *LATENCY_ROLES.get((series, stat), ()),
            headline=stat in HEADLINE_STATS,
            fmt=",.4g",
        )
        for series, (words, unit) in LATENCY_SERIES.items()
        for stat in LATENCY_STATS
    ],
    _m("mean_latency_ms", "mean iteration latency", "ms", LOWER, TABLE, CI_CHECK, SEARCH, headline=True),
    *[
        _m(f"p{p}_latency_ms", f"p{p} iteration latency", "ms", LOWER, SEARCH, headline=p in (50, 99))
        for p in ITERATION_PERCENTILES
    ],
    _m("peak_memory_bytes", "peak memory", "GB", LOWER, TABLE, PLOT, scale=GB, fmt=",.3g"),
    _m("peak_memory_bytes_total", "peak memory, all ranks", "GB", LOWER, scale=GB, fmt=",.3g"),
    _m("weights_bytes", "weights (one rank)", "GB", None, scale=GB, fmt=",.3g"),
    _m("kv_cache_bytes", "KV cache (one rank)", "GB", None, scale=GB, fmt=",.3g", engines=NANOEXP_ONLY),
    _m("num_preemptions", "preemptions", "", LOWER, TABLE, fmt=",.0f", engines=NANOEXP_ONLY),
    _m("prefix_cache_hit_rate", "prefix cache hit rate", "", HIGHER, TABLE, fmt=".1%", engines=NANOEXP_ONLY),
    _m("num_kv_blocks", "KV blocks", "", None, fmt=",.0f", engines=NANOEXP_ONLY),
    _m("kv_block_size", "KV block size", "tokens", None, fmt=",.0f", engines=NANOEXP_ONLY),
    _m(
        "total_cached_tokens",
        "prompt tokens from the prefix cache",
        "",
        None,
        fmt=",.0f",
        engines=NANOEXP_ONLY,
    ),
    _m("total_preempted_requests", "preempted requests", "", LOWER, fmt=",.0f", engines=NANOEXP_ONLY),
    _m("peak_kv_blocks_used", "peak KV blocks used", "", None, fmt=",.0f", engines=NANOEXP_ONLY),
    _m("peak_kv_cache_usage", "peak KV cache usage", "", None, fmt=".1%", engines=NANOEXP_ONLY),
    *[
        _m(f"{phase}_time_s", f"{phase} step time", "s", None, fmt=",.3g")
        for phase in ("prefill", "decode", "mixed")
    ],
    *[
        _m(f"{phase}_tokens", f"{phase} step tokens", "", None, fmt=",.0f")
        for phase in ("prefill", "decode", "mixed")
    ],
    _m("kv_quality/greedy_agreement", "KV cache greedy agreement", "", HIGHER, TABLE, SEARCH, fmt=".2%"),
    *[
        _m(
            f"kv_quality/kl_{k}",
            f"KV cache KL {k}",
            "nats",
            LOWER,
            SEARCH,
            *(TABLE,) * (k in ("mean", "max")),
            fmt=".3g",
        )
        for k in ("mean", "p99", "max")
    ],
    _m(
        "weight_quality/greedy_agreement",
        "fp8 weights greedy agreement",
        "",
        HIGHER,
        TABLE,
        SEARCH,
        fmt=".2%",
    ),
    *[
        _m(
            f"weight_quality/kl_{k}",
            f"fp8 weights KL {k}",
            "nats",
            LOWER,
            SEARCH,
            *(TABLE,) * (k in ("mean", "max")),
            fmt=".3g",
        )
        for k in ("mean", "p99", "max")
    ],
    _m("capacity_request_rate", "capacity under the SLOs", "req/s", HIGHER, TABLE, fmt=",.3g"),
    _m("capacity_bracket_low", "capacity bracket, low", "req/s", None, TABLE, fmt=",.3g"),
    _m("capacity_bracket_high", "capacity bracket, high", "req/s", None, TABLE, fmt=",.3g"),
    _m("expert_load_imbalance_max", "expert load imbalance (worst layer, max / mean)", "", LOWER, fmt=",.3g"),
    _m("expert_load_imbalance_mean", "expert load imbalance (mean over layers)", "", LOWER, fmt=",.3g"),
]
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


class UnknownMetric(ValueError):
    pass


def get(name: str) -> Metric | None:
    return BY_NAME.get(name)


def names(role: str | None = None, headline: bool | None = None) -> list[str]:
    """The registry's metric names, in table order, with `role` and/or the headline mark."""
    return [
        m.name
        for m in METRICS
        if (role is None or role in m.roles) and (headline is None or m.headline == headline)
    ]


def better(name: str) -> str | None:
    metric = BY_NAME.get(name)
    return metric.better if metric else None


def title(name: str) -> str:
    metric = BY_NAME.get(name)
    return metric.title() if metric else name.replace("_", " ")


def unit(name: str) -> tuple[str, float]:
    """(unit, divisor) of a metric's displayed values; ("", 1) for one the registry does not know."""
    metric = BY_NAME.get(name)
    return (metric.unit, metric.scale) if metric else ("ms" if name.endswith("_ms") else "", 1.0)


def display(name: str, value) -> str:
    """A value as a researcher reads it: 14,547 tok/s, 75.4 GB, 12.5%; "" for a missing one."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    metric = BY_NAME.get(name)
    return metric.display(value) if metric else format(value, ",.4g")


def applies(name: str, engine_kind: str | None) -> bool:
    metric = BY_NAME.get(name)
    return metric is None or engine_kind is None or engine_kind in metric.engines


def not_applicable(engine_kind: str) -> list[str]:
    """The metrics an engine kind does not have (the transformers baseline: no KV blocks, no prefix cache)."""
    return [m.name for m in METRICS if engine_kind not in m.engines]


def check_names(
    requested: Iterable[str], known_elsewhere: Iterable[str] = (), what: str = "--metrics"
) -> None:
    """Raises UnknownMetric naming every requested name neither in the registry nor in `known_elsewhere`
    (the summary keys the jobs wrote), with the closest known names."""
    known = set(BY_NAME) | set(known_elsewhere)
    unknown = [n for n in requested if n not in known]
    if not unknown:
        return
    hints = {n: difflib.get_close_matches(n, sorted(known), n=3) for n in unknown}
    said = "; ".join(f"{n!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for n, h in hints.items())
    raise UnknownMetric(f"{what}: unknown metric {said}; known: the registry's names or any summary key")
