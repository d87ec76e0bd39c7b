"""Where a result came from: the code (commit, dirty tree, a hash of the diff), the packages, the
machine (device, driver, CUDA, CPU, host) and the command line. Each probe that cannot answer
(no git checkout, no GPU, no nvidia-smi) says why in its field instead of failing the job."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "triton", "transformers", "flash-attn", "hydra-core", "wandb", "numpy")
REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE_TIMEOUT_S = 10.0


def collect_provenance(repo: Path = REPO_ROOT) -> dict:
    """The job's provenance as plain data (see the module docstring)."""
    return {
        "git": git_state(repo),
        "packages": package_versions(),
        "python": platform.python_version(),
        "device": device_facts(),
        "cpu": cpu_facts(),
        "hostname": socket.gethostname(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
    }


def git_state(repo: Path) -> dict:
    """commit, dirty (uncommitted or untracked files) and diff_sha256 (of `git diff HEAD` plus the
    untracked files' names); outside a checkout every field says so."""
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        status = _git(repo, "status", "--porcelain")
        diff = _git(repo, "diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError) as err:
        reason = f"unknown: {_first_line(err) or 'git failed'} in {repo}"
        return {"commit": reason, "dirty": None, "diff_sha256": None}
    untracked = "".join(line for line in status.splitlines(keepends=True) if line.startswith("??"))
    digest = hashlib.sha256((diff + untracked).encode()).hexdigest() if status else ""
    return {"commit": commit, "dirty": bool(status), "diff_sha256": digest}


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise subprocess.SubprocessError(proc.stderr.strip() or f"git {args[0]} exited {proc.returncode}")
    return proc.stdout


def package_versions() -> dict[str, str | None]:
    """The installed version of each of PACKAGES (None: not installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_facts() -> dict:
    """The GPUs this job sees (from nvidia-smi, which does not start CUDA in this process), the
    driver, and the CUDA version torch was built with."""
    import torch

    facts = {"cuda_build": torch.version.cuda, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        rows = _nvidia_smi()
    except (OSError, subprocess.SubprocessError) as err:
        return facts | {"gpus": [], "driver": f"unknown: {_first_line(err) or 'nvidia-smi failed'}"}
    gpus = _visible(rows, facts["cuda_visible_devices"])
    return facts | {"gpus": [g["name"] for g in gpus], "driver": gpus[0]["driver"] if gpus else None}


def _nvidia_smi() -> list[dict]:
    query = "--query-gpu=index,uuid,name,driver_version"
    proc = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise subprocess.SubprocessError(proc.stderr.strip() or f"nvidia-smi exited {proc.returncode}")
    rows = [[part.strip() for part in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    return [{"index": r[0], "uuid": r[1], "name": r[2], "driver": r[3]} for r in rows if len(r) == 4]


def _visible(rows: list[dict], visible: str | None) -> list[dict]:
    """The GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs), in its order; all when unset."""
    if visible is None:
        return rows
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    by_key = {r["index"]: r for r in rows} | {r["uuid"]: r for r in rows}
    return [by_key[w] for w in wanted if w in by_key]


def cpu_facts() -> dict:
    """The CPU model, its logical CPUs and how many of them this process may run on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {"model": _cpu_model(), "count": os.cpu_count(), "usable": usable}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]
