"""Runs each step on every rank: in this process for one rank, in worker processes for several."""

from __future__ import annotations

import atexit
import gc
import os
import signal
import threading
import weakref
from collections.abc import Callable

import torch

from nanoexp.config import EngineConfig
from nanoexp.config.checks import KnobError
from nanoexp.runner.model_runner import ModelRunner
from nanoexp.runner.model_setup import check_execution, checked_hf_config
from nanoexp.runner.step_hooks import PhaseHooks
from nanoexp.runner.step_input import RunnerInfo, StepInput
from nanoexp.runner.workers import WorkerGroup, invoke


class InProcessExecutor:
    """The one rank's runner lives in this process."""

    def __init__(self, config: EngineConfig):
        self.runner: ModelRunner | None = ModelRunner(config)
        self.info: RunnerInfo = self.runner.info()
        self.final_stats: dict = {}

    def live_runner(self) -> ModelRunner:
        if self.runner is None:
            raise RuntimeError("the engine is closed")
        return self.runner

    def call(self, method: str | Callable, *args):
        """Runs a runner method by name, or `method(runner, *args)`; returns its result."""
        return invoke(self.live_runner(), method, args)

    def run(self, step: StepInput) -> list[int]:
        tokens = self.live_runner().run(step)
        assert tokens is not None  # the one rank is rank 0
        return tokens

    def launch(self, step: StepInput) -> None:
        self.live_runner().launch(step)

    def collect(self) -> list[int]:
        tokens = self.live_runner().collect()
        assert tokens is not None
        return tokens

    def set_phase_hooks(self, hooks: PhaseHooks | None) -> bool:
        """The runner tells `hooks` of its phases (RUNNER_PHASES); False once closed."""
        if self.runner is None:
            return False
        self.runner.phase_hooks = hooks
        return True

    def stats(self) -> dict:
        """The runner's facts; after close, those it had when it closed."""
        return (
            {**(stats := self.runner.stats()), **per_rank_memory([stats])}
            if self.runner
            else self.final_stats
        )

    @property
    def closed(self) -> bool:
        return self.runner is None

    def close(self) -> None:
        """Releases weights, KV cache and graphs now: a later engine here sizes its cache from free memory."""
        if self.runner is None:
            return
        self.final_stats = self.stats()
        self.runner.close()
        self.runner = None
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialized


_live: weakref.WeakSet = weakref.WeakSet()
_previous_sigterm: list = []  # the handler SIGTERM had before ours, once ours is installed


@atexit.register
def _close_all() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: that hook joins
    # non-daemonic children and would wait forever for workers that were never told to stop.
    for executor in list(_live):
        executor.close()


def _on_sigterm(signum: int, frame) -> None:
    """Stops the workers, removes the rendezvous dir and ring, then does what SIGTERM did before."""
    for executor in list(_live):
        executor.kill()
    previous = _previous_sigterm[0]
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm_cleanup() -> None:
    """Once, from the main thread, unless SIGTERM is ignored (then there is nothing to clean up)."""
    if _previous_sigterm or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return
    _previous_sigterm.append(previous)
    signal.signal(signal.SIGTERM, _on_sigterm)


class MultiprocExecutor:
    """Same interface as InProcessExecutor; every rank lives in its own worker process."""

    def __init__(self, config: EngineConfig):
        """A worker past its deadline is an error, as a dead one: a step's is $NANOEXP_TP_STEP_TIMEOUT_S
        (default 60 s) + 10x the slowest step so far, start-up's $NANOEXP_TP_STARTUP_TIMEOUT_S (1800 s)."""
        check_execution(config)  # fail before spawning: the devices, the kernels, the split, the length
        checked_hf_config(config)
        size = self.size = config.parallel.tensor_parallel_size
        have = torch.cuda.device_count()  # 0 without CUDA
        if config.execution.device != "cpu" and torch.cuda.is_available() and have < size:
            why = f"needs that many CUDA devices; {have} available"
            raise KnobError("parallel.tensor_parallel_size", size, f"at most {have}", why)
        install_sigterm_cleanup()
        self.group = WorkerGroup(config)
        self.finalizer = weakref.finalize(self, self.group.stop)
        _live.add(self)
        try:
            self.info: RunnerInfo = self.group.receive(list(range(self.size)), startup=True)[0]
        except BaseException:
            self.close()
            raise

    def call(self, method: str | Callable, *args, reply: bool = True):
        """InProcessExecutor.call on every rank (a module-level `method` pickles); rank 0's result or None."""
        if not self.finalizer.alive:
            raise RuntimeError("the engine is closed (its tensor-parallel workers were shut down)")
        try:
            self.group.send(method, *args)
            return self.group.receive([0])[0] if reply else None
        except BaseException:
            self.close()  # a half-finished step leaves the ranks out of step: stop them all
            raise

    def launch(self, step: StepInput) -> None:
        self.call("launch", step, reply=False)

    def collect(self) -> list[int]:
        return self.call("collect")

    def run(self, step: StepInput) -> list[int]:
        return self.call("run", step)

    def set_phase_hooks(self, hooks: PhaseHooks | None) -> bool:
        """False: the runners are in the workers, out of the hooks' reach."""
        return False

    def stats(self) -> dict:
        """Rank 0's facts, and each rank's memory (every rank replies to "stats"): `<key>_per_rank` lists
        and `<key>_total` sums, so TP memory is never one rank's share read as the whole."""
        if not self.finalizer.alive:
            raise RuntimeError("the engine is closed (its tensor-parallel workers were shut down)")
        try:
            self.group.send("stats")
            ranks = self.group.receive(list(range(self.size)))
        except BaseException:
            self.close()
            raise
        return {**ranks[0], **per_rank_memory(ranks), "tensor_parallel_size": self.size}

    @property
    def closed(self) -> bool:
        """Closed by the caller, or by itself when a worker died or hung."""
        return not self.finalizer.alive

    def close(self) -> None:
        self.finalizer()
        _live.discard(self)

    def kill(self) -> None:
        """Stops the workers at once (no goodbye) and removes what they shared."""
        if self.finalizer.detach():
            self.group.stop(graceful=False)
        _live.discard(self)


PER_RANK_KEYS = ("peak_memory_bytes", "weights_bytes", "kv_cache_bytes")


def per_rank_memory(ranks: list[dict]) -> dict:
    """Each rank's value of PER_RANK_KEYS as `<key>_per_rank` and their sum as `<key>_total`; the plain
    key stays rank 0's, and `memory_per_rank` says so."""
    out: dict = {
        "memory_per_rank": "peak_memory_bytes, weights_bytes, kv_cache_bytes: rank 0's; see _per_rank"
    }
    for key in PER_RANK_KEYS:
        values = [int(r.get(key, 0)) for r in ranks]
        out |= {f"{key}_per_rank": values, f"{key}_total": sum(values)}
    return out


def make_executor(config: EngineConfig) -> InProcessExecutor | MultiprocExecutor:
    return (InProcessExecutor if config.parallel.tensor_parallel_size == 1 else MultiprocExecutor)(config)
