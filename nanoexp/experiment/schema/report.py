"""The `report` section: what the sweep report shows beside its main metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


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
