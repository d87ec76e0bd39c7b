"""Give each job of a local sweep its own GPUs by narrowing CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os
import shutil
import subprocess


def claim(gpus_per_job: int, job_num: int) -> list[str]:
    """Keep slice `job_num` (wrapping around) of the visible GPUs; a no-op for gpus_per_job=0.

    Must run before CUDA is initialised in this process (the engine is not built yet).
    """
    if gpus_per_job <= 0:
        return []
    visible = visible_gpus()
    if not visible:
        return []
    slots = max(1, len(visible) // gpus_per_job)
    start = (job_num % slots) * gpus_per_job
    mine = visible[start : start + gpus_per_job]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return mine


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return [str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU")]
