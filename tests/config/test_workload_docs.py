"""Every workload a user can pick is listed by `python run.py --help` and documented in the knob reference
the README points to, with what it is and an example command that selects it."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT, run_py

WORKLOADS = sorted(p.stem for p in (ROOT / "conf" / "workload").glob("*.yaml"))


def test_help_lists_every_workload(tmp_path: Path) -> None:
    proc = run_py(tmp_path, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (listed,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("workload: ")]
    assert sorted(listed.removeprefix("workload: ").split(", ")) == WORKLOADS


def test_every_workload_is_described_with_an_example_command() -> None:
    docs = (ROOT / "docs" / "knobs.md").read_text()
    assert "docs/knobs.md" in (ROOT / "README.md").read_text()
    commands = [ln for ln in docs.splitlines() if "python run.py" in ln]
    for name in WORKLOADS:
        assert any(re.search(rf"workload={name}\b", ln) for ln in commands), f"no example selects {name}"
        assert f"`{name}`" in docs, f"{name} is not described"
