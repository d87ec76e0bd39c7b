"""The live progress line of a job: one tqdm bar (requests done, output tok/s, running / waiting,
KV usage, preemptions), shown only on a terminal and with engine.use_tqdm=true.

It is fed once per engine step, outside the engine's timed step. A step costs a few counter
additions; the bar is redrawn at most every REFRESH_S seconds, so the line costs far less than
1% of a run (tests/test_trust_progress.py measures it).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

from nanoexp.engine.outputs import StepStats

REFRESH_S = 0.25


class Progress:
    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None, desc: str = "requests"):
        stream = sys.stderr if stream is None else stream
        self.enabled = enabled and _is_tty(stream)
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit="req",
            file=stream,
            disable=not self.enabled,
            dynamic_ncols=True,
            mininterval=REFRESH_S,
            leave=True,
        )
        self.done = self.tokens = self.preemptions = 0
        self.started: float | None = None
        self.next_draw = 0.0

    def update(self, stats: StepStats, counted: bool = True) -> None:
        """One engine step; `counted=False` for untimed (warm-up) steps, shown but not counted."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.started is None:
            self.started = now - stats.step_time_s
        if counted:
            self.done += stats.num_finished
        self.tokens += stats.num_output_tokens
        self.preemptions += stats.num_preemptions
        if now >= self.next_draw:
            self.next_draw = now + REFRESH_S
            self._draw(stats, now)

    def _draw(self, stats: StepStats, now: float) -> None:
        rate = self.tokens / max(now - self.started, 1e-9)
        usage = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
        self.bar.n = self.done
        self.bar.set_postfix_str(
            f"{rate:,.0f} out tok/s, running {stats.num_running}, waiting {stats.num_waiting}, "
            f"KV {usage:.0%}, preemptions {self.preemptions}",
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.enabled:
            self.bar.n = self.done
            self.bar.refresh()
        self.bar.close()


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
