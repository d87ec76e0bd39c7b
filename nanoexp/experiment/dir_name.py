"""Job dir names made from override values, kept inside the sweep dir."""

from __future__ import annotations

import hashlib

NAME_MAX = 200  # bytes of a job dir name; file systems allow 255


def safe_dir_name(name: str) -> str:
    """A job dir name from its overrides (hydra.sweep.subdir) that stays one path component inside
    the sweep dir: a value's `/` (`workload.path=../../x.jsonl`) is spelled %2F, and a name too
    long for the file system is cut, with a hash of the whole name to keep it unique."""
    name = name.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    encoded = name.encode()
    if len(encoded) <= NAME_MAX:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:12]
    return encoded[: NAME_MAX - 13].decode(errors="ignore") + "~" + digest
