"""The `profile` group: what to profile in the timed passes; off, it costs nothing."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.checks import integer


@dataclass
class ProfileConfig:
    """What to profile in the timed passes (experiment/measure/profiling.py); off, it costs nothing."""

    trace_steps: int = 0  # a torch profiler Chrome trace of this many timed steps (0 = none)
    trace_first_step: int = 0  # the first traced step, counted from the start of the pass
    trace_repeat: int = 0  # the pass (repeat) traced
    host_phases: bool = False  # the host's time per step phase, as host_*_ms columns of steps.csv
    events: bool = False  # Triton compiles, torch.compile graphs, garbage collections per timed step

    def __post_init__(self) -> None:
        integer("profile.trace_steps", self.trace_steps, 0, " (0 = no trace)")
        integer("profile.trace_first_step", self.trace_first_step, 0)
        integer("profile.trace_repeat", self.trace_repeat, 0)

    @property
    def enabled(self) -> bool:
        return bool(self.trace_steps or self.host_phases or self.events)
