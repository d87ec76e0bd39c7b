"""Runs each step on every rank: in this process for one rank, in worker processes for several."""

from __future__ import annotations

from collections.abc import Callable

from nanoexp.config import EngineConfig
from nanoexp.runner.model_runner import ModelRunner
from nanoexp.runner.step_input import StepInput
from nanoexp.runner.workers import MultiprocExecutor


class InProcessExecutor:
    """The one rank's runner lives in this process."""

    def __init__(self, config: EngineConfig):
        self.runner = ModelRunner(config)
        self.info = self.runner.info()

    def call(self, method: str | Callable, *args):
        """Runs a runner method by name, or `method(runner, *args)`; returns its result."""
        return getattr(self.runner, method)(*args) if isinstance(method, str) else method(self.runner, *args)

    def run(self, step: StepInput) -> list[int]:
        return self.runner.run(step)

    def launch(self, step: StepInput) -> None:
        self.runner.launch(step)

    def collect(self) -> list[int]:
        return self.runner.collect()

    def stats(self) -> dict:
        return self.runner.stats()

    def close(self) -> None:
        self.runner.close()


def make_executor(config: EngineConfig) -> InProcessExecutor | MultiprocExecutor:
    if config.parallel.tensor_parallel_size == 1:
        return InProcessExecutor(config)
    return MultiprocExecutor(config)
