"""How noisy a job's measurement was: the machine's load during each timed pass, and flags for a job
whose machine was busy or whose repeats' confidence intervals are wide."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from nanoexp.experiment.interrupts import process_tree
from nanoexp.experiment.schema import NoiseConfig

log = logging.getLogger(__name__)
LOAD_KEYS = ("load_avg_1m_before", "load_avg_1m_after", "process_cpu_cores", "other_cpu_cores")
CI_CHECKED = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "mean_latency_ms")


class LoadMeter:
    """Started before a timed pass; `read()` after it gives the pass's LOAD_KEYS and cpu_count.
    `other_cpu_cores` is what the rest of the machine ran during the pass, in cores: busy CPU time
    minus this process tree's, over the wall time (unlike the load average, without the job's own)."""

    def __init__(self) -> None:
        self.load_before = _load_avg()
        self.busy_before, self.tree_before = _busy_cpu_s(), _tree_cpu_s()
        self.start = time.perf_counter()

    def read(self) -> dict:
        wall = time.perf_counter() - self.start
        out = {"load_avg_1m_before": self.load_before, "load_avg_1m_after": _load_avg()}
        out["cpu_count"] = os.cpu_count() or 0
        own = _tree_cpu_s() - self.tree_before
        out["process_cpu_cores"] = own / wall if wall > 0 else 0.0
        busy = _busy_cpu_s()
        if busy is None or self.busy_before is None or wall <= 0:
            out["other_cpu_cores"] = float("nan")  # not on Linux
        else:
            out["other_cpu_cores"] = max(0.0, (busy - self.busy_before - own) / wall)
        return out


def noise_flags(summary: dict, per_repeat: list[dict], cfg: NoiseConfig) -> dict:
    """`noise_busy_repeats` (passes during which the rest of the machine used more than
    `cfg.busy_cores` cores), `noise_wide_ci` (metrics whose 95% CI half-width exceeds
    `cfg.max_ci_share` of the mean) and `noise_warning`, one line ("" when neither)."""
    busy = [r for r in per_repeat if r.get("other_cpu_cores", 0.0) > cfg.busy_cores]
    wide = [f"{m} ±{share:.0%}" for m in CI_CHECKED if (share := _ci_share(summary, m)) > cfg.max_ci_share]
    parts = []
    if busy:
        worst = max(r["other_cpu_cores"] for r in busy)
        parts.append(
            f"machine busy in {len(busy)} of {len(per_repeat)} repeats (up to {worst:.1f} other cores)"
        )
    if wide:
        parts.append(f"wide CI: {', '.join(wide)} of the mean")
    warning = "; ".join(parts)
    if warning:
        log.warning("noisy measurement: %s", warning)
    return {"noise_busy_repeats": len(busy), "noise_wide_ci": ", ".join(wide), "noise_warning": warning}


def _ci_share(summary: dict, metric: str) -> float:
    """The CI's half-width over the mean (0 without a CI)."""
    low, high, mean = (summary.get(k) for k in (f"{metric}_ci95_low", f"{metric}_ci95_high", metric))
    if not all(isinstance(v, int | float) for v in (low, high, mean)) or not mean or low != low:
        return 0.0
    return abs(high - low) / 2 / abs(mean)


def _load_avg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _busy_cpu_s() -> float | None:
    """Seconds of CPU time every CPU spent busy since boot (all but idle and iowait); None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (tensor-parallel workers)."""
    return sum(_process_cpu_s(pid) for pid in process_tree(os.getpid()))


def _process_cpu_s(pid: int) -> float:
    if pid == os.getpid():
        t = os.times()
        return t.user + t.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
