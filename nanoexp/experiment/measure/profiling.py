"""The `profile.*` knobs (README: Explain): a torch profiler trace of chosen timed steps, the host's time
per step phase, and the compiles and garbage collections that hit a timed step. With a knob on, the
profiler is the engine's step hooks (LLMEngine.set_hooks; a few microseconds a step); all off, no hook is."""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from nanoexp.experiment.runtime import atomic_files
from nanoexp.experiment.schema import ProfileConfig
from nanoexp.runner.step_hooks import ENGINE_PHASES

log = logging.getLogger(__name__)
PROFILE_DIR = "profile"
EVENTS = ("triton_compiles", "torch_compiles", "gc_collections", "gc_full_collections")


class StepProfiler:
    """Profiles one job's repeats: `columns[i]` holds the steps.csv columns of timed step i."""

    def __init__(self, cfg: ProfileConfig, engine, out_dir: Path):
        self.cfg, self.engine = cfg, engine
        self.columns: dict[int, dict] = {}
        self.phases: dict[str, float] = defaultdict(float)
        self.events: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()  # events of earlier steps
        self.phase_starts: dict[str, float] = {}
        self.reported: tuple[str, ...] = ()  # the phases the engine tells of (the runner's: when in-process)
        self.trace_path = out_dir / PROFILE_DIR / f"trace_repeat{cfg.trace_repeat}.json"
        self.gc_started, self.tracing, self.step_started = 0, False, 0.0  # gc_started: perf_counter_ns
        self.log_steps: Any = None  # the repeat being profiled: its StepLog
        self.trace: Any = None  # and its torch profiler

    @contextmanager
    def repeat(self, repeat: int, log_steps):
        """Profiles one repeat; `log_steps` (the StepLog) says whether a step is timed and its index."""
        self.log_steps, self.trace = log_steps, None
        if self.cfg.trace_steps and repeat == self.cfg.trace_repeat:  # started before the repeat's clock: its
            # start-up is in no timed step; its schedule counts timed steps only (trace.step() after each)
            self.trace = _torch_profiler(self.cfg.trace_first_step, self.cfg.trace_steps, self.trace_path)
            self.trace.start()
            self.tracing = True
        self.reported = self.engine.set_hooks(self, self if self.cfg.host_phases else None)
        try:
            with self._event_hooks() if self.cfg.events else nullcontext():
                yield
        finally:
            self.engine.set_hooks(None, None)
            if self.tracing:
                self.trace.stop()
                self.tracing = False

    def summary(self, since: int = 0) -> dict:
        """The event totals of the timed steps from index `since` on (one repeat)."""
        if not self.cfg.events:
            return {}
        steps = [c for i, c in self.columns.items() if i >= since]
        return {f"profile_{k}": sum(c[k] for c in steps) for k in (*EVENTS, "gc_ms")}

    def job_summary(self) -> dict:
        """The traces written and the timed steps that compiled (with a warning line naming them)."""
        traced = self.cfg.trace_steps and self.trace_path.is_file()
        out = {"profile_traces": str(self.trace_path) if traced else ""}
        steps = [i for i, c in self.columns.items() if c.get("triton_compiles") or c.get("torch_compiles")]
        if self.cfg.events:
            out["profile_compiled_steps"] = " ".join(map(str, steps))
        if steps:
            names = ", ".join(map(str, steps[:20]))
            log.warning("%d timed steps compiled a kernel or graph (steps %s)", len(steps), names)
        return out

    def step_begin(self) -> None:
        self.phases.clear()
        self.step_started = time.perf_counter()

    def step_end(self) -> None:
        elapsed = time.perf_counter() - self.step_started
        if self.log_steps.recording:
            self.columns[self.log_steps.index] = self._step_columns(elapsed)
            if self.trace is not None:
                self.trace.step()

    def phase_begin(self, phase: str) -> None:
        self.phase_starts[phase] = time.perf_counter()

    def phase_end(self, phase: str) -> None:
        self.phases[phase] += time.perf_counter() - self.phase_starts[phase]

    def _step_columns(self, elapsed: float) -> dict:
        columns = {}
        if self.cfg.host_phases:
            p = self.phases
            out = {"step": elapsed} | {k: p[k] for k in ENGINE_PHASES}
            if "forward" in self.reported:  # the launch's parts
                out |= {"prepare": p["prepare"], "forward": p["forward"]}
                out["sample"] = p["launch"] - p["prepare"] - p["forward"]
            out["other"] = elapsed - sum(p[k] for k in ENGINE_PHASES)  # they are disjoint parts of the step
            columns = {f"host_{k}_ms": v * 1e3 for k, v in out.items()}
        if self.cfg.events:  # the events since the last timed step (between-step ones count in the next)
            current = {**self.events, "torch_compiles": _torch_graphs()}
            new = {k: current.get(k, 0) - self.seen.get(k, 0) for k in (*EVENTS, "gc_ns")}
            self.seen = Counter(current)
            gc_ms = new.pop("gc_ns") / 1e6
            columns |= new | {"gc_ms": gc_ms}
        return columns

    @contextmanager
    def _event_hooks(self):
        self.seen = Counter({**self.events, "torch_compiles": _torch_graphs()})
        triton_knobs = _triton_runtime_knobs()
        previous = triton_knobs.jit_post_compile_hook if triton_knobs else None

        def on_triton_compile(*args, **kwargs):
            self.events["triton_compiles"] += 1
            return previous(*args, **kwargs) if previous else None

        if triton_knobs:
            triton_knobs.jit_post_compile_hook = on_triton_compile
        gc.callbacks.append(self._on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_gc)
            if triton_knobs:
                triton_knobs.jit_post_compile_hook = previous

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_started = time.perf_counter_ns()
            return
        self.events["gc_collections"] += 1
        self.events["gc_full_collections"] += info["generation"] == 2
        self.events["gc_ns"] += time.perf_counter_ns() - self.gc_started


def _torch_profiler(first: int, count: int, path: Path):
    from torch.profiler import profile, schedule

    warmup = min(1, first)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = schedule(wait=first - warmup, warmup=warmup, active=count, repeat=1)
    export = lambda prof: atomic_files.write_by_name(path, prof.export_chrome_trace)
    return profile(schedule=steps, on_trace_ready=export)  # default activities: CPU, and CUDA if present


def _torch_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was ever compiled
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


def _triton_runtime_knobs():
    try:
        import triton
    except ImportError:
        return None
    return getattr(getattr(triton, "knobs", None), "runtime", None)
