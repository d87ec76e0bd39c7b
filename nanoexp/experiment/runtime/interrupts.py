"""SIGTERM and SIGINT end a job as a failure like any other (exit 128 + signal), after its cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

EXIT_NOW_AFTER = 3  # signals received before the process exits without cleaning up


class Interrupted(KeyboardInterrupt):
    """The job was stopped by a signal; `exit_code` is 128 + its number."""

    reported = False  # its job already recorded it (a sweep's process re-raises it to stop the sweep)

    def __init__(self, signum: int = signal.SIGINT):
        self.signum, self.signal_name, self.exit_code = signum, signal.Signals(signum).name, 128 + signum
        super().__init__(f"interrupted by {self.signal_name}")


received: list[int] = []  # the signals this process got, in order


def install() -> None:
    """Turns SIGTERM and SIGINT into `Interrupted`; only the main thread can install handlers."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _on_signal)


def _on_signal(signum: int, frame) -> None:
    received.append(signum)
    if len(received) >= EXIT_NOW_AFTER:
        os._exit(128 + received[0])
    if len(received) == 1:
        raise Interrupted(signum)


def as_interrupted(error: KeyboardInterrupt) -> Interrupted:
    """A plain KeyboardInterrupt (no handler installed, e.g. in a notebook) is a SIGINT."""
    return error if isinstance(error, Interrupted) else Interrupted(signal.SIGINT)


def die_with_sweep(poll_s: float = 1.0) -> None:
    """In a job of a local sweep, SIGTERM to this process once the sweep or its job controller is gone."""
    controller = os.getppid()
    sweep = _parent_of(controller)
    if sweep is None:
        return

    def watch() -> None:
        while os.getppid() == controller and _parent_of(controller) == sweep:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="nanoexp-sweep-watch", daemon=True).start()


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants, children first (from /proc; just `pid` where there is none)."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return [member for child in children for member in process_tree(child)] + [pid]


def _parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc (None where there is no /proc or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # after the name, which may hold spaces
