"""scripts/setup.sh's install commands on machines with and without CUDA or torch, by dry run in a
fake environment (a stand-in venv python and nvidia-smi): nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH = "torch==2.13.0"  # pyproject.toml's [tool.nanoexp] torch, the pin setup.sh reads


def fake_machine(tmp_path: Path, cuda: bool, torch: bool) -> tuple[Path, dict]:
    """A venv whose python imports torch or not, and an nvidia-smi that finds a GPU or not."""
    venv, tools = tmp_path / "venv", tmp_path / "tools"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    tools.mkdir(exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit {0 if torch else 1}\nexit 0\n')
    smi = tools / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexit {0 if cuda else 9}\n")  # first on PATH: hides a real one
    for script in (python, smi):
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOEXP_")}
    env |= {"NANOEXP_VENV": str(venv), "NANOEXP_SETUP_DRY_RUN": "1", "PATH": f"{tools}:{env['PATH']}"}
    return venv, env


def install_commands(tmp_path: Path, purpose: str, cuda: bool, torch: bool, **env_vars: str) -> list[str]:
    venv, env = fake_machine(tmp_path, cuda, torch)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), purpose],
        env=env | env_vars,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    python = str(venv / "bin" / "python")
    return [line.replace(python, "python").replace(str(ROOT), "ROOT") for line in proc.stdout.splitlines()]


UPGRADE_PIP = "python -m pip install -q --upgrade pip"
CPU_TORCH = f"python -m pip install -q --retries 1 --index-url {CPU_INDEX} {TORCH}"
PYPI_TORCH = f"python -m pip install -q {TORCH}"
PROJECT = "python -m pip install -q -e 'ROOT[experiment]'"
WITH_TRITON = "python -m pip install -q -e 'ROOT[experiment,triton]'"
WITH_TESTS = "python -m pip install -q -e 'ROOT[experiment,test,triton]'"


@pytest.mark.parametrize(
    ("purpose", "cuda", "torch", "expected"),
    [
        ("run", False, False, [CPU_TORCH, PROJECT]),
        ("test", False, False, [CPU_TORCH, WITH_TESTS]),
        ("run", True, False, [PYPI_TORCH, WITH_TRITON]),
        ("test", True, False, [PYPI_TORCH, WITH_TESTS]),
        ("run", False, True, [PROJECT]),
        ("run", True, True, [WITH_TRITON]),
    ],
)
def test_torch_from_the_cpu_index_without_cuda_and_triton_where_it_runs(
    tmp_path: Path, purpose: str, cuda: bool, torch: bool, expected: list[str]
) -> None:
    """No CUDA: the CPU build from PyTorch's CPU index, and Triton only for the tests (the CPU
    suite runs the Triton kernels in its interpreter); a torch already there is reused."""
    assert install_commands(tmp_path, purpose, cuda, torch) == [UPGRADE_PIP, *expected]


def test_another_torch_index_or_pips_own(tmp_path: Path) -> None:
    mirror = install_commands(tmp_path / "a", "run", False, False, NANOEXP_TORCH_INDEX="https://mirror/cpu")
    assert mirror[1] == f"python -m pip install -q --retries 1 --index-url https://mirror/cpu {TORCH}"
    own = install_commands(tmp_path / "b", "run", False, False, NANOEXP_TORCH_INDEX="")
    assert own[1] == PYPI_TORCH


def test_an_installed_venv_installs_only_missing_extras(tmp_path: Path) -> None:
    venv, _ = fake_machine(tmp_path, cuda=False, torch=True)
    stamp = venv / ".nanoexp-installed"
    stamp.write_text("experiment\n")  # set up for `run`: the experiment layer, no Triton on a CPU
    os.utime(stamp, (2**31, 2**31))  # newer than pyproject.toml
    assert install_commands(tmp_path, "run", False, True) == []
    assert install_commands(tmp_path, "test", False, True)[-1] == WITH_TESTS
    stamp.write_text("experiment\ntest\ntriton\n")
    os.utime(stamp, (2**31, 2**31))
    assert install_commands(tmp_path, "test", False, True) == []


def test_setup_needs_a_purpose(tmp_path: Path) -> None:
    _, env = fake_machine(tmp_path, cuda=False, torch=True)
    for args in ([], ["deploy"]):
        setup = ["bash", str(ROOT / "scripts" / "setup.sh"), *args]
        proc = subprocess.run(setup, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "run or test" in proc.stderr


def test_the_torch_pin_comes_from_pyproject(tmp_path: Path) -> None:
    """pyproject.toml's [tool.nanoexp] torch is the one pin: a copy of the project whose table names
    another version installs that version, and one without the table stops with a clear line."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "scripts" / "setup.sh").write_text((ROOT / "scripts" / "setup.sh").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'\ntorch = "{TORCH.removeprefix("torch==")}"\n' in pyproject
    _, env = fake_machine(tmp_path, cuda=True, torch=False)
    setup = ["bash", str(project / "scripts" / "setup.sh"), "run"]

    (project / "pyproject.toml").write_text(pyproject.replace(TORCH.removeprefix("torch=="), "2.99.1"))
    proc = subprocess.run(setup, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.splitlines()[1].endswith("pip install -q torch==2.99.1")

    (project / "pyproject.toml").write_text(pyproject.replace("[tool.nanoexp]", "[tool.other]"))
    proc = subprocess.run(setup, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no [tool.nanoexp] torch" in proc.stderr
