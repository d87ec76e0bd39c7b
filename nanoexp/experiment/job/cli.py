"""run.py's Hydra app as a command: a config Hydra rejects before any job starts (a bad override, a missing
option) is one line and exit 2, as a job's config errors are; an output dir Hydra cannot write, exit 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from nanoexp.experiment.job.failures import (
    CLI_FULL_ERROR,
    CONFIG_EXIT,
    FULL_ERROR,
    RUNTIME_EXIT,
    user_wants_full_error,
)
from nanoexp.experiment.runtime import interrupts
from nanoexp.experiment.runtime.atomic_files import unwritable


def cli(app: Callable[[], object]) -> None:
    """Runs the Hydra app; a config Hydra rejects before any job starts is one line and exit 2 too."""
    interrupts.install()
    if user_wants_full_error():
        app()
        return
    os.environ |= {FULL_ERROR: "1", CLI_FULL_ERROR: "1"}  # Hydra re-raises instead of reporting
    try:
        app()
    except HydraException as e:
        print(f"nanoexp: error: {hydra_line(e)}", file=sys.stderr)
        sys.exit(CONFIG_EXIT)
    except OSError as e:  # Hydra creating the job's dir or its .hydra files (ours are caught in the job)
        print(f"nanoexp: error: {unwritable(e.filename or 'the output dir', e)}", file=sys.stderr)
        sys.exit(RUNTIME_EXIT)
    except KeyboardInterrupt as e:  # a sweep stopped by a signal; its jobs reported themselves
        interrupt = interrupts.as_interrupted(e)
        if not getattr(interrupt, "reported", False):
            print(f"nanoexp: error: {interrupt}", file=sys.stderr)
        sys.exit(interrupt.exit_code)
    finally:
        os.environ.pop(FULL_ERROR, None)
        os.environ.pop(CLI_FULL_ERROR, None)


def hydra_line(e: Exception) -> str:
    """Hydra's multi-line report as one line: its first line plus the detail that names the value."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    if isinstance(e, MissingConfigException) and e.options:
        return f"{lines[0]} (available: {', '.join(e.options)})"
    if isinstance(e.__cause__, OmegaConfBaseException):
        detail = str(e.__cause__).strip().splitlines()[0]  # its key is in the override already
        if "'.inf'" in detail or "'-.inf'" in detail:  # --help and the presets show YAML's spelling
            detail += " (on the command line infinity is inf or -inf; .inf is YAML's spelling)"
        return f"{lines[0].rstrip('.')}: {detail}"
    if isinstance(e, OverrideParseException) and len(lines) > 1:
        return f"{lines[0]}: {lines[1]}"
    return lines[0]
