"""Results and report files written whole or not at all: each goes to a temporary file in its directory,
is flushed to disk, and is renamed over its name; a failure on the way (a full disk, a read-only dir)
removes the temporary file and raises, so no reader ever sees an empty or half-written file. Every
results.json, CSV, JSONL, Markdown table and plot of a job or a sweep is written through here."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

PARTIAL = ".partial"


@contextlib.contextmanager
def _renamed_into_place(path: Path | str, partial_suffix: str = PARTIAL) -> Iterator[Path]:
    """The temporary path `<name><partial_suffix>` beside `path`, renamed over it when the block ends;
    removed instead when anything in the block fails."""
    path = Path(path)
    partial = path.with_name(path.name + partial_suffix)
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


@contextlib.contextmanager
def atomic_open(
    path: Path | str, mode: str = "w", newline: str | None = None, partial_suffix: str = PARTIAL
) -> Iterator[IO[Any]]:
    """A file opened for writing (`mode` "w" text or "wb") under `<name><partial_suffix>`, renamed into
    place once written and synced; removed instead when anything fails."""
    text = "b" not in mode
    with _renamed_into_place(path, partial_suffix) as partial:
        with partial.open(mode, encoding="utf-8" if text else None, newline=newline if text else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_atomically(path: Path | str, text: str, partial_suffix: str = PARTIAL) -> None:
    with atomic_open(path, partial_suffix=partial_suffix) as f:
        f.write(text)


def save_figure(fig, path: Path | str, **savefig_kwargs: Any) -> None:
    """A matplotlib figure, in the format its suffix names."""
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=Path(path).suffix.lstrip("."), **savefig_kwargs)


def write_table(table, path: Path | str) -> None:
    """A pandas DataFrame as CSV, without its index."""
    with atomic_open(path, newline="") as f:
        table.to_csv(f, index=False)


def write_by_name(path: Path | str, write: Callable[[str], None]) -> None:
    """A file a library writes only by name (a profiler trace): `write` gets the temporary name."""
    with _renamed_into_place(path) as partial:
        write(str(partial))
        with partial.open("rb+") as f:
            os.fsync(f.fileno())


def unwritable(path: Path | str, err: OSError, key: str = "hydra.run.dir or hydra.sweep.dir") -> str:
    """The one line for an output dir (or file) that cannot be written, job or sweep alike (exit 1)."""
    return f"cannot write '{path}': {err.strerror or err} (set {key} to a writable directory)"
