"""What an observer of the step path (a profiler) is told, through LLMEngine.set_hooks. Unset, each hook
point costs one None check."""

from __future__ import annotations

from typing import Protocol

ENGINE_PHASES = ("schedule", "launch", "collect", "bookkeeping")  # disjoint parts of a step, on the host
RUNNER_PHASES = ("prepare", "forward")  # parts of "launch", where the runner is in the engine's process


class StepHooks(Protocol):
    def step_begin(self) -> None: ...

    def step_end(self) -> None: ...  # a step that raises gets no step_end


class PhaseHooks(Protocol):
    def phase_begin(self, phase: str) -> None: ...

    def phase_end(self, phase: str) -> None: ...  # a phase that raises gets no phase_end
