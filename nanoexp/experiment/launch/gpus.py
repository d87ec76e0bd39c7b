"""Give each job of a local sweep its own GPUs by narrowing CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 2.0


def claim(gpus_per_job: int, ranks: int, job_num: int, lock_dir: Path | None = None) -> list[str]:
    """Narrows CUDA_VISIBLE_DEVICES to this job's GPUs, never fewer than its ranks (none for gpus_per_job=0);
    with `lock_dir`, never ones another job holds."""
    visible = visible_gpus() if gpus_per_job > 0 else []
    if not visible:
        return []
    count = min(max(gpus_per_job, ranks), len(visible))
    start = (job_num * count) % len(visible)
    order = visible[start:] + visible[:start]
    mine = order[:count]
    if lock_dir is not None:
        lock_dir.mkdir(parents=True, exist_ok=True)
        if not (mine := try_take(order, count, lock_dir)):
            print(f"nanoexp: waiting for {count} free GPU(s)", file=sys.stderr, flush=True)
        while not mine:
            time.sleep(POLL_S)
            mine = try_take(order, count, lock_dir)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return mine


def try_take(order: list[str], count: int, lock_dir: Path) -> list[str]:
    """Takes `count` free GPUs atomically (one sweep-wide file lock), or none."""
    host = socket.gethostname()
    with open(lock_dir / f"{host}.mutex", "a") as mutex:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        free = [g for g in order if not held(lock_dir / f"{host}-gpu{g}")]
        if len(free) < count:
            return []
        for gpu in free[:count]:
            (lock_dir / f"{host}-gpu{gpu}").write_text(str(os.getpid()))
        return free[:count]


def held(lock: Path) -> bool:
    """A GPU is held while the process in its lock file lives (not this one: it may run several jobs)."""
    try:
        pid = int(lock.read_text())
        if pid == os.getpid():
            return False
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return True
    except (OSError, ValueError):  # no lock file, or its process is gone
        return False
    return True


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES less the GPUs the machine lacks (as submitit lists them), else all GPUs."""
    present = physical_gpus()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return present
    listed = [d.strip() for d in env.split(",") if d.strip()]
    return [d for d in listed if not d.isdigit() or d in present]


def physical_gpus() -> list[str]:
    """Indices of the machine's GPUs from nvidia-smi, else from /dev/nvidiaN; none on a CPU box."""
    if shutil.which("nvidia-smi") is not None:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        count = sum(line.startswith("GPU") for line in listing.splitlines())
    else:
        count = len(glob.glob("/dev/nvidia[0-9]*"))  # not nvidiactl, nvidia-uvm, ...
    return [str(i) for i in range(count)]
