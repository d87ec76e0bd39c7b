"""Provenance: the git state of a checkout (and of no checkout), the GPUs a job sees, the rest."""

from __future__ import annotations

import subprocess
from pathlib import Path

from nanoexp.experiment.launch import gpus, provenance
from nanoexp.experiment.launch.provenance import collect_provenance, device_facts, git_state


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_outside_a_checkout_says_so(tmp_path: Path) -> None:
    state = git_state(tmp_path)
    assert state["commit"].startswith("unknown:") and str(tmp_path) in state["commit"]
    assert state["dirty"] is None and state["diff_sha256"] is None


def test_git_state_tracks_commit_dirty_tree_and_diff(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    clean = git_state(tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False and clean["diff_sha256"] == ""
    (tmp_path / "a.py").write_text("x = 2\n")
    edited = git_state(tmp_path)
    (tmp_path / "b.py").write_text("")
    untracked = git_state(tmp_path)
    assert edited["dirty"] and edited["commit"] == clean["commit"] and len(edited["diff_sha256"]) == 64
    assert untracked["diff_sha256"] != edited["diff_sha256"]  # a new file changes the hash too


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch) -> None:
    listing = "".join(f"{i}, GPU-{i}, H{i}, 570\n" for i in range(4))
    monkeypatch.setattr(provenance, "_run", lambda *cmd: listing)
    monkeypatch.setattr(gpus, "physical_gpus", lambda: ["0", "1", "2", "3"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_facts() | {"cuda_build": None} == {
        "cuda_build": None,
        "cuda_visible_devices": None,
        "gpus": ["H0", "H1", "H2", "H3"],
        "driver": "570",
    }
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-0")
    assert device_facts()["gpus"] == ["H2", "H0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert device_facts()["gpus"] == [] and device_facts()["driver"] is None


def test_provenance_has_every_field() -> None:
    prov = collect_provenance()
    assert set(prov) >= {"git", "packages", "python", "device", "cpu", "hostname", "command"}
    assert prov["packages"]["torch"] and "flash-attn" in prov["packages"]
    assert prov["cpu"]["count"] >= 1 and prov["cpu"]["model"]
    assert {"gpus", "driver", "cuda_build"} <= set(prov["device"])
