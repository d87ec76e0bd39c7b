"""The files of a checkpoint directory that are read: only regular files inside it (a FIFO never
hangs the loader, an index never points outside), and JSON side files whose errors name the file."""

from __future__ import annotations

import glob
import json
import os
import stat

INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or a tensor whose shape config.json contradicts."""


def regular_file(path: str, checkpoint_dir: str) -> str:
    """`path` if it is a regular file (after following links) inside the checkpoint directory (or,
    for a Hugging Face hub snapshot, inside its repo's cache, where the links point)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"checkpoint file {path} is not a regular file (a FIFO, device or directory); "
            "a checkpoint holds regular files only"
        )
    real, roots = os.path.realpath(path), [os.path.realpath(checkpoint_dir)]
    parent = os.path.dirname(os.path.abspath(checkpoint_dir))
    if os.path.basename(parent) == "snapshots":  # <repo cache>/snapshots/<revision> -> ../../blobs
        roots.append(os.path.realpath(os.path.dirname(parent)))
    if not any(os.path.commonpath([real, root]) == root for root in roots):
        raise CheckpointError(f"checkpoint file {path} links to {real}, outside the checkpoint directory")
    return path


def json_object(path: str, checkpoint_dir: str) -> dict:
    """A JSON side file of the checkpoint holding an object; errors name the file, the line and the column."""
    regular_file(path, checkpoint_dir)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        msg = f"{err.msg} at line {err.lineno} column {err.colno}"
        raise CheckpointError(f"{path}: not valid JSON ({msg})") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


def safetensors_files(checkpoint_dir: str) -> list[str]:
    """The files the index names (each inside the directory), else every *.safetensors there."""
    index = os.path.join(checkpoint_dir, INDEX_FILE)
    if not os.path.lexists(index):
        files = sorted(glob.glob(os.path.join(glob.escape(checkpoint_dir), "*.safetensors")))
        return [regular_file(f, checkpoint_dir) for f in files]
    weight_map = json_object(index, checkpoint_dir).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f'{index}: needs "weight_map", an object of tensor name -> file name')
    for tensor, name in weight_map.items():
        parts = name.replace("\\", "/").split("/")
        if os.path.isabs(name) or ".." in parts or not name:
            where = f"{index}: weight_map[{tensor!r}] = {name!r}"
            raise CheckpointError(f"{where} points outside the checkpoint directory")
    names = sorted(set(weight_map.values()))
    return [regular_file(os.path.join(checkpoint_dir, name), checkpoint_dir) for name in names]
