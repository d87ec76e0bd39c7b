"""Where a result came from: code, packages, machine and command; a failed probe says why in its field."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from nanoexp.experiment.launch.gpus import visible_gpus
from nanoexp.experiment.sinks.local import first_line

PACKAGES = ("torch", "triton", "transformers", "flash-attn", "hydra-core", "wandb", "numpy")
REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE_TIMEOUT_S = 10.0


def collect_provenance(repo: Path = REPO_ROOT) -> dict:
    return {
        "git": git_state(repo),
        "packages": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "device": device_facts(),
        "cpu": cpu_facts(),
        "hostname": socket.gethostname(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
    }


def git_state(repo: Path) -> dict:
    """commit, dirty and the SHA-256 of `git diff HEAD` plus the untracked files' names."""
    try:
        commit = _run("git", "-C", str(repo), "rev-parse", "HEAD").strip()
        status = _run("git", "-C", str(repo), "status", "--porcelain")
        diff = _run("git", "-C", str(repo), "diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError) as err:
        return {"commit": f"unknown: {first_line(err, 200)} in {repo}", "dirty": None, "diff_sha256": None}
    untracked = "".join(line for line in status.splitlines(keepends=True) if line.startswith("??"))
    digest = hashlib.sha256((diff + untracked).encode()).hexdigest() if status else ""
    return {"commit": commit, "dirty": bool(status), "diff_sha256": digest}


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if proc.returncode != 0:
        raise subprocess.SubprocessError(proc.stderr.strip() or f"{shlex.join(cmd)} exited {proc.returncode}")
    return proc.stdout


def _version(package: str) -> str | None:
    return next((dist.version for dist in metadata.distributions(name=package)), None)


def device_facts() -> dict:
    """The GPUs this job sees (nvidia-smi does not start CUDA here), the driver and torch's CUDA build."""
    facts = {"cuda_build": torch.version.cuda, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        out = _run("nvidia-smi", "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader")
    except (OSError, subprocess.SubprocessError) as err:
        return facts | {"gpus": [], "driver": f"unknown: {first_line(err, 200)}"}
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
    by_key = {key: row for row in rows if len(row) == 4 for key in row[:2]}  # by index and by UUID
    gpus = [by_key[gpu] for gpu in visible_gpus() if gpu in by_key]  # as CUDA_VISIBLE_DEVICES orders them
    return facts | {"gpus": [gpu[2] for gpu in gpus], "driver": gpus[0][3] if gpus else None}


def cpu_facts() -> dict:
    """The CPU model, its logical CPUs and how many of them this process may run on."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor() or platform.machine() or "unknown"
    with contextlib.suppress(OSError):  # not Linux
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), model)
    return {"model": model, "count": os.cpu_count(), "usable": usable}
