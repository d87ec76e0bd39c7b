"""Tensor parallelism: one spawned worker process per rank, and the pipes that drive them.

The main process runs no rank itself, so it never blocks inside a collective: it waits on the
workers' pipes and process sentinels together and notices a dead worker within a poll interval.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, wait

import torch
from tqdm import tqdm

from nanoexp.config import EngineConfig
from nanoexp.runner.model_runner import ModelRunner

PARENT_POLL_S = 1.0
JOIN_TIMEOUT_S = 5.0
# NVLink multicast (NVLS, symmetric-memory multimem) off unless the environment says otherwise:
# the all-reduces here do not need it, and on shared hosts it can take the GPUs out of service.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
UNANSWERED = frozenset({"launch"})  # enqueued without a reply; its result comes with "collect"
STARTUP_HINT = (
    " (its traceback is above; a script that builds the engine at import time must guard that"
    " with `if __name__ == '__main__':` because workers are spawned)"
)


# ---- worker side -----------------------------------------------------------------------------


def worker_main(config: EngineConfig, rank: int, dist_init: str, conn: Connection, parent: int) -> None:
    """Entry point of one rank: build the runner, then serve commands until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    for key, value in NO_MULTICAST_ENV.items():
        os.environ.setdefault(key, value)  # read by NCCL when the communicator is created
    if config.execution.device == "cpu" or not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.parallel.tensor_parallel_size))
    use_thread_lock_for_tqdm()
    try:
        runner = ModelRunner(config, rank, dist_init)
        conn.send(("ok", runner.info() if rank == 0 else None))
        serve(runner, rank, conn, parent)
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the control plane
        send_error(conn, err)
    # Skip interpreter teardown (seconds with torch loaded); only stdio needs flushing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def use_thread_lock_for_tqdm() -> None:
    """tqdm (which torch.compile uses) otherwise creates a multiprocessing lock that a worker's
    os._exit leaves to the resource tracker, which then warns of a leaked semaphore."""
    tqdm.set_lock(threading.RLock())


def serve(runner: ModelRunner, rank: int, conn: Connection, parent: int) -> None:
    while True:
        while not conn.poll(PARENT_POLL_S):
            if os.getppid() != parent:
                return  # orphaned: the control plane is gone
        try:
            method, args = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if method == "close":
            runner.close()
            return
        result = getattr(runner, method)(*args) if isinstance(method, str) else method(runner, *args)
        if rank == 0 and method not in UNANSWERED:
            conn.send(("ok", result))


def send_error(conn: Connection, err: BaseException) -> None:
    try:
        conn.send(("error", type(err), str(err)))
    except Exception:  # noqa: BLE001 - the pipe may be gone; the sentinel reports the death then
        pass


# ---- control plane ---------------------------------------------------------------------------


class WorkerGroup:
    """The processes, pipes and rendezvous directory; owns no reference to the executor so a
    finalizer can shut it down when the executor is collected."""

    def __init__(self, config: EngineConfig):
        ctx = mp.get_context("spawn")
        self.tmpdir = tempfile.mkdtemp(prefix="nanoexp-tp-")
        dist_init = "file://" + os.path.join(self.tmpdir, "rendezvous")
        self.conns: list[Connection] = []
        self.procs = []
        for rank in range(config.parallel.tensor_parallel_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main, name=f"nanoexp-tp-rank{rank}",
                args=(config, rank, dist_init, child_end, os.getpid()),
            )
            proc.start()
            child_end.close()
            self.conns.append(parent_end)
            self.procs.append(proc)

    def send(self, method: str, *args) -> None:
        data = pickle.dumps((method, args))
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(data)
            except OSError:
                self.raise_dead(rank)

    def receive(self, ranks: list[int], startup: bool = False) -> list:
        """Waits for one reply from each of `ranks`; any error or death elsewhere aborts."""
        replies: dict[int, object] = {}
        while len(replies) < len(ranks):
            ready = wait(self.conns + [p.sentinel for p in self.procs])
            # Deaths first: a survivor's "peer closed the connection" error is only a symptom.
            dead = [r for r, p in enumerate(self.procs) if p.sentinel in ready]
            for rank in dead + [r for r, c in enumerate(self.conns) if c in ready and r not in dead]:
                if rank in dead and not self.conns[rank].poll():
                    self.raise_dead(rank, startup)
                reply = self.read(rank, startup)  # raises on an error report or end of pipe
                if rank in ranks:
                    replies[rank] = reply
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
        if startup:
            raise rebuild_error(rank, reply[1], reply[2]) from None
        raise RuntimeError(f"tensor-parallel worker rank {rank} failed: {name_of(reply[1])}: {reply[2]}")

    def raise_dead(self, rank: int, startup: bool = False):
        proc = self.procs[rank]
        proc.join(0.5)
        code = proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            how += f", {signal.Signals(-code).name}"
        hint = STARTUP_HINT if startup else ""
        self.kill()
        raise RuntimeError(
            f"tensor-parallel worker rank {rank} died ({how}); all workers were shut down{hint}"
        ) from None

    def kill(self) -> None:
        """Stops every worker now (they may be blocked in a collective with the dead one)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        self.reap(JOIN_TIMEOUT_S)

    def shutdown(self) -> None:
        try:
            self.send("close")
        except RuntimeError:
            pass  # a worker is already gone; kill() below takes care of the rest
        self.reap(JOIN_TIMEOUT_S)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        self.reap(2.0)
        self.kill()

    def reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def name_of(cls: type) -> str:
    return getattr(cls, "__name__", "error")


def rebuild_error(rank: int, cls: type, message: str) -> BaseException:
    """A startup error in the main process: same type and message, so the user sees one line."""
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a constructor with other arguments
            pass
    return RuntimeError(f"tensor-parallel worker rank {rank} failed at startup: {name_of(cls)}: {message}")


def stop_group(group: WorkerGroup) -> None:
    try:
        group.shutdown()
    finally:
        group.release()
