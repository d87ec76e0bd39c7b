"""The names of a sweep's job dirs (Hydra's `hydra.sweep.subdir` resolvers): one path component each, numbered
after the jobs an earlier sweep left in the same dir."""

from __future__ import annotations

import hashlib
import os

NAME_MAX = 200  # bytes of a job dir name; file systems allow 255
JOB_NUM_OFFSET = "NANOEXP_JOB_NUM_OFFSET"  # set by the sweep callback: jobs appended to a sweep come after


def safe_dir_name(name: str) -> str:
    """A job dir name that stays one path component (`/` is %2F) and fits the file system (cut, hashed)."""
    name = name.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    encoded = name.encode()
    if len(encoded) <= NAME_MAX:
        return name
    return encoded[: NAME_MAX - 13].decode(errors="ignore") + "~" + hashlib.sha1(encoded).hexdigest()[:12]


def job_number(num: int | str) -> int:
    """A job's number in its sweep dir: Hydra's, after the jobs an earlier sweep left there (append_to_sweep),
    so an appended job never takes (and overwrites) an earlier job's dir."""
    return int(num) + int(os.environ.get(JOB_NUM_OFFSET, "0") or 0)
