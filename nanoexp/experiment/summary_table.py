"""The compact summary table printed at the end of a job."""

from __future__ import annotations

import math

from nanoexp.experiment.job import JobInfo

ROWS = [
    ("requests", "completed", "{:.0f}"),
    ("input / output tokens", ("total_input_tokens", "total_output_tokens"), "{:.0f} / {:.0f}"),
    ("duration", "duration_s", "{:.2f} s"),
    ("output throughput", "output_throughput", "{:.1f} tok/s"),
    ("total throughput", "total_token_throughput", "{:.1f} tok/s"),
    ("request throughput", "request_throughput", "{:.2f} req/s"),
    ("TTFT mean / p99", ("mean_ttft_ms", "p99_ttft_ms"), "{:.1f} / {:.1f} ms"),
    ("TPOT mean / p99", ("mean_tpot_ms", "p99_tpot_ms"), "{:.2f} / {:.2f} ms"),
    ("ITL mean / p99", ("mean_itl_ms", "p99_itl_ms"), "{:.2f} / {:.2f} ms"),
    ("E2E mean / p99", ("mean_e2el_ms", "p99_e2el_ms"), "{:.1f} / {:.1f} ms"),
    ("iteration latency mean / p99", ("mean_latency_ms", "p99_latency_ms"), "{:.1f} / {:.1f} ms"),
    ("prefix cache hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("preemptions", "num_preemptions", "{:.0f}"),
    ("weights / KV cache", ("weights_bytes", "kv_cache_bytes"), "{:.3g} / {:.3g} GB"),
    ("peak memory", "peak_memory_bytes", "{:.3g} GB"),
    ("load / warmup / graphs", ("load_s", "warmup_s", "graph_capture_s"), "{:.2f} / {:.2f} / {:.2f} s"),
]
GB_KEYS = {"weights_bytes", "kv_cache_bytes", "peak_memory_bytes"}


def format_summary(summary: dict, job: JobInfo | None = None) -> str:
    get = lambda k: summary.get(k, "?")
    head = f"{get('engine_kind')} | {get('model')} ({get('load_format')} weights) | {get('workload')}"
    lines = [head, "-" * len(head)]
    for label, keys, fmt in ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        values = [_value(summary, k) for k in keys]
        if all(v is not None for v in values):
            lines.append(f"{label:<30}{fmt.format(*values)}")
    if job is not None:
        lines.append(f"{'results':<30}{job.out_dir / 'results.json'}")
    return "\n".join(lines)


def print_summary(summary: dict, job: JobInfo | None = None) -> None:
    print(format_summary(summary, job), flush=True)


def _value(summary: dict, key: str) -> float | None:
    v = summary.get(key)
    if not isinstance(v, int | float) or (isinstance(v, float) and math.isnan(v)):
        return None
    return v / 1e9 if key in GB_KEYS else v
