"""Tensor parallelism: a spawned worker process per rank, a shared-memory ring carrying each command to
all of them, pipes carrying replies (and oversized commands). The main process runs no rank, so it never
blocks in a collective: waiting on pipes and process sentinels together, it notices a dead worker at
once and a stuck one at the step deadline."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

import torch
from tqdm import tqdm

from nanoexp.config import EngineConfig
from nanoexp.kernels.all_reduce import NO_MULTICAST_ENV
from nanoexp.runner.model_runner import ModelRunner
from nanoexp.runner.shm_ring import RingHandle, ShmRing, unlink

JOIN_TIMEOUT_S = 5.0
RING_SLOTS = 8
RING_SLOT_BYTES = 4 << 20  # a decode step of 256 sequences is ~50 KB pickled; larger ones use the pipes
# How long an idle worker busy-waits for the next command before sleeping with backoff: on a GPU
# longer than a decode step, so the next one is picked up at once; on a CPU short, cores are few.
SPIN_S = {"cuda": 0.05, "cpu": 0.0005}
# The step deadline: STEP_TIMEOUT_FLOOR_S + SLOWEST_STEP_FACTOR x the slowest step so far; start-up
# (loading, profiling, graph capture, compilation) has its own. Environment variables override both.
STEP_TIMEOUT_ENV, STARTUP_TIMEOUT_ENV = "NANOEXP_TP_STEP_TIMEOUT_S", "NANOEXP_TP_STARTUP_TIMEOUT_S"
STEP_TIMEOUT_FLOOR_S = 60.0
STARTUP_TIMEOUT_S = 1800.0
SLOWEST_STEP_FACTOR = 10.0
PARENT_POLL_S = 0.5  # how often a starting worker (or the janitor) checks that the main process is alive
PR_SET_PDEATHSIG = 1  # prctl(2)
JANITOR = """
import os, shutil, sys, time
main, tmpdir, ring = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while os.getppid() == main and os.path.isdir(tmpdir):
    time.sleep(float(sys.argv[4]))
shutil.rmtree(tmpdir, ignore_errors=True)
try:
    os.unlink(os.path.join("/dev/shm", ring.lstrip("/")))
except OSError:
    pass
"""  # removes the rendezvous dir and the ring when the main process dies without releasing them
UNANSWERED = frozenset({"launch"})  # enqueued without a reply; its result comes with "collect"
ANSWERED_BY_ALL = frozenset({"stats"})  # every rank replies (its own memory), not rank 0 alone
STARTUP_HINT = (
    " (its traceback is above; a script that builds the engine at import time must guard that"
    " with `if __name__ == '__main__':` because workers are spawned)"
)


# ---- worker side -----------------------------------------------------------------------------


def worker_main(
    config: EngineConfig, rank: int, dist_init: str, conn: Connection, parent: int, ring_handle: RingHandle
) -> None:
    """Entry point of one rank: build the runner, then serve commands until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    for key, value in NO_MULTICAST_ENV.items():
        os.environ.setdefault(key, value)  # read by NCCL when the communicator is created
    if config.execution.device == "cpu" or not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.parallel.tensor_parallel_size))
    use_thread_lock_for_tqdm()
    ring = ShmRing.attach(ring_handle, rank)
    check_parent = functools.partial(exit_if_orphaned, parent, dist_init, ring_handle)
    started = threading.Event()
    if not die_with_parent(signal.SIGKILL):  # then a thread watches the parent during start-up
        threading.Thread(
            target=watch_parent, args=(started, check_parent), name="nanoexp-tp-parent-watch", daemon=True
        ).start()
    check_parent()  # it died before the line above took effect
    try:
        runner = ModelRunner(config, rank, dist_init)
        gc.freeze()  # as the engine does: no full garbage collection in a step walks the start-up heap
        conn.send(("ok", runner.info() if rank == 0 else None))
        started.set()
        die_with_parent(0)  # serving, the command loop watches the parent (and cleans up)
        serve(runner, rank, conn, ring, check_parent)
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the control plane
        with contextlib.suppress(Exception):  # the pipe may be gone; the sentinel reports the death then
            conn.send(("error", type(err), str(err)))
        check_parent()
    ring.close()
    # Skip interpreter teardown (seconds with torch loaded); only stdio needs flushing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def die_with_parent(sig: int) -> bool:
    """Linux: the kernel sends `sig` when the thread that started this process exits (0: never), even while
    start-up sits in C++ holding the GIL (the janitor then cleans up); False without prctl."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(started: threading.Event, check_parent: Callable[[], None]) -> None:
    """Without a parent-death signal: a worker whose main process dies during start-up cleans up, exits."""
    while not started.wait(PARENT_POLL_S):
        check_parent()


def use_thread_lock_for_tqdm() -> None:
    """tqdm (torch.compile uses it) would otherwise create a multiprocessing lock that os._exit
    leaves to the resource tracker, which then warns of a leaked semaphore."""
    tqdm.set_lock(threading.RLock())


def serve(
    runner: ModelRunner, rank: int, conn: Connection, ring: ShmRing, check_parent: Callable[[], None]
) -> None:
    spin_s = SPIN_S[runner.device.type]
    while True:
        data = ring.read(check_parent, spin_s)
        if data is None:  # too large for a slot: this one came over the pipe
            data = conn.recv_bytes()
        method, args = pickle.loads(data)
        if method == "close":
            runner.close()
            return
        result = invoke(runner, method, args)
        if (rank == 0 or method in ANSWERED_BY_ALL) and method not in UNANSWERED:
            conn.send(("ok", result))


def invoke(runner: ModelRunner, method: str | Callable, args: tuple):
    """A runner method by name, or a module-level function called as `method(runner, *args)`."""
    return getattr(runner, method)(*args) if isinstance(method, str) else method(runner, *args)


def exit_if_orphaned(parent: int, dist_init: str, ring_handle: RingHandle) -> None:
    """A main process that died without cleaning up (SIGKILL): its worker removes what it left, and exits."""
    if os.getppid() != parent:
        shutil.rmtree(os.path.dirname(dist_init.removeprefix("file://")), ignore_errors=True)
        unlink(ring_handle.name)
        os._exit(0)


# ---- control plane ---------------------------------------------------------------------------


class WorkerGroup:
    """Processes, ring, pipes, rendezvous dir; no reference to the executor, so its finalizer can stop it."""

    def __init__(self, config: EngineConfig):
        self.step_floor_s = timeout_from(STEP_TIMEOUT_ENV, STEP_TIMEOUT_FLOOR_S)
        self.startup_timeout_s = timeout_from(STARTUP_TIMEOUT_ENV, STARTUP_TIMEOUT_S)
        self.slowest_step_s = 0.0
        self.tmpdir = tempfile.mkdtemp(prefix="nanoexp-tp-")
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        self.ring: ShmRing | None = None
        self.janitor: subprocess.Popen | None = None
        try:
            self.ring = ShmRing.create(config.parallel.tensor_parallel_size, RING_SLOTS, RING_SLOT_BYTES)
            if os.path.isdir("/dev/shm"):  # a process (no torch) removing the dir and ring once main is gone
                args = [
                    sys.executable,
                    "-c",
                    JANITOR,
                    str(os.getpid()),
                    self.tmpdir,
                    self.ring.handle.name,
                    str(PARENT_POLL_S),
                ]
                quiet = subprocess.DEVNULL
                self.janitor = subprocess.Popen(args, stdin=quiet, stdout=quiet, stderr=quiet)
            self.start_workers(config)
        except BaseException:  # e.g. spawning from a module without a __main__ guard, or a signal
            self.stop(graceful=False)
            raise

    def start_workers(self, config: EngineConfig) -> None:
        ctx = mp.get_context("spawn")
        dist_init = "file://" + os.path.join(self.tmpdir, "rendezvous")
        assert self.ring is not None
        for rank in range(config.parallel.tensor_parallel_size):
            parent_end, child_end = ctx.Pipe()
            args = (config, rank, dist_init, child_end, os.getpid(), self.ring.handle)
            proc = ctx.Process(target=worker_main, name=f"nanoexp-tp-rank{rank}", args=args)
            self.conns.append(parent_end)
            proc.start()
            child_end.close()
            self.procs.append(proc)

    def step_deadline_s(self) -> float:
        return self.step_floor_s + SLOWEST_STEP_FACTOR * self.slowest_step_s

    def send(self, method: str | Callable, *args, timeout: float | None = None) -> None:
        """Publishes one command to every rank: once in the ring, or over each pipe if too large."""
        assert self.ring is not None, "the ring exists from start-up until stop()"
        data = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        deadline = time.monotonic() + (timeout or self.step_deadline_s())
        if self.ring.write(data, lambda: self.check_workers(deadline)):
            return
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(data)
            except OSError:
                self.raise_dead(rank)

    def check_workers(self, deadline: float) -> None:
        """Raises if a worker died or the deadline passed (while the ring is full)."""
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                self.raise_dead(rank)
        if time.monotonic() > deadline:
            self.raise_stuck(list(range(len(self.procs))), self.step_deadline_s(), startup=False)

    def receive(self, ranks: list[int], startup: bool = False) -> list:
        """Waits for one reply from each of `ranks`; an error, a death or the deadline aborts."""
        start = time.monotonic()
        timeout = self.startup_timeout_s if startup else self.step_deadline_s()
        replies: dict[int, object] = {}
        while len(replies) < len(ranks):
            left = start + timeout - time.monotonic()
            ready = wait(self.conns + [p.sentinel for p in self.procs], timeout=max(0.0, left))
            if not ready:
                self.raise_stuck([r for r in ranks if r not in replies], timeout, startup)
            # Deaths first: a survivor's "peer closed the connection" error is only a symptom.
            dead = [r for r, p in enumerate(self.procs) if p.sentinel in ready]
            for rank in dead + [r for r, c in enumerate(self.conns) if c in ready and r not in dead]:
                if rank in dead and not self.conns[rank].poll():
                    self.raise_dead(rank, startup)
                reply = self.read(rank, startup)  # raises on an error report or end of pipe
                if rank in ranks:
                    replies[rank] = reply
        if not startup:
            self.slowest_step_s = max(self.slowest_step_s, time.monotonic() - start)
        return [replies[r] for r in ranks]

    def read(self, rank: int, startup: bool):
        try:
            reply = self.conns[rank].recv()
        except (EOFError, OSError):
            self.raise_dead(rank, startup)
        except Exception as err:  # noqa: BLE001 - e.g. an exception class main cannot import
            self.kill()
            raise RuntimeError(f"tensor-parallel worker rank {rank} failed: {err}") from None
        if reply[0] == "ok":
            return reply[1]
        self.kill()
        _, cls, message = reply
        when = " at startup" if startup else ""
        error = RuntimeError(f"tensor-parallel worker rank {rank} failed{when}: {cls.__name__}: {message}")
        if startup and issubclass(cls, Exception):  # the same type and message: the user sees one line
            with contextlib.suppress(Exception):  # a constructor with other arguments
                error = cls(message)
        raise error from None

    def raise_dead(self, rank: int, startup: bool = False):
        self.procs[rank].join(0.5)
        code = self.procs[rank].exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            how += f", {signal.Signals(-code).name}"
        hint = STARTUP_HINT if startup else ""
        self.kill()
        raise RuntimeError(
            f"tensor-parallel worker rank {rank} died ({how}); all workers were shut down{hint}"
        ) from None

    def raise_stuck(self, awaited: list[int], timeout: float, startup: bool):
        """A worker that neither answers nor dies (stopped, deadlocked, hung in a collective)."""
        states = [process_state(proc.pid) if proc.pid is not None else "" for proc in self.procs]
        stopped = [rank for rank, state in enumerate(states) if state in ("T", "t")]
        rank = (stopped or awaited)[0]
        what = "start-up" if startup else "step"
        env = STARTUP_TIMEOUT_ENV if startup else STEP_TIMEOUT_ENV
        state = " (stopped)" if rank in stopped else ""
        self.kill()
        raise RuntimeError(
            f"tensor-parallel worker rank {rank}{state} did not finish within the {what} deadline of "
            f"{timeout:.1f} s; all workers were shut down (set {env} to change it)"
        ) from None

    def kill(self) -> None:
        """Stops every worker now (they may be blocked in a collective with the dead one)."""
        for proc in self.procs:
            proc.kill()  # a no-op on an exited one
        self.reap(JOIN_TIMEOUT_S)

    def stop(self, graceful: bool = True) -> None:
        """Stops the workers (graceful: told to close, then terminated, before any is killed) and removes
        what they shared."""
        try:
            if graceful:
                with contextlib.suppress(RuntimeError):  # a worker already gone: kill() below stops the rest
                    self.send("close", timeout=JOIN_TIMEOUT_S)
                self.reap(JOIN_TIMEOUT_S)
                for proc in self.procs:
                    proc.terminate()
                self.reap(2.0)
            self.kill()
        finally:
            self.release()

    def reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        for conn in self.conns:
            conn.close()
        if self.ring is not None:
            self.ring.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.janitor is not None:
            self.janitor.kill()
            self.janitor.wait()


def timeout_from(env: str, default: float) -> float:
    """The environment variable, else the default; must be > 0."""
    raw = os.environ.get(env, default)
    with contextlib.suppress(TypeError, ValueError):
        if 0 < float(raw) < math.inf:
            return float(raw)
    raise ValueError(f"{env}={raw!r} is invalid: must be a positive number of seconds")


def process_state(pid: int) -> str:
    """The one-letter state in /proc/PID/stat ("T": stopped), or "" where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
