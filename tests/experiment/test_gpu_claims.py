"""GPU claiming per job (hydra/launcher=local_gpus): visible GPUs, lock files, never two jobs on one GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nanoexp.experiment.launch import gpus


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: ["0", "1", "2", "3"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # submitit's gpus_per_node=8


def test_visible_gpus_drop_indices_the_machine_lacks(four_gpus):
    assert gpus.visible_gpus() == ["0", "1", "2", "3"]


def test_no_gpus_means_no_claim(monkeypatch):
    monkeypatch.setattr(gpus, "physical_gpus", lambda: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpus.claim(2, 1, 1) == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_claim_covers_the_ranks(four_gpus, monkeypatch):
    assert gpus.claim(1, 2, 0) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gpus.claim(2, 1, 0) == ["0", "1"]
    assert gpus.claim(0, 4, 0) == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # 0: off


def test_locked_claims_never_share_a_gpu(four_gpus, tmp_path, monkeypatch):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert gpus.try_take(["0", "1", "2", "3"], 1, tmp_path) == ["0"]
        for lock in tmp_path.glob("*-gpu*"):
            lock.write_text(str(other.pid))  # as if job 0 (still running) held GPU 0
        assert gpus.claim(2, 1, 1, tmp_path) == ["2", "3"]
        for lock in tmp_path.glob("*-gpu[23]"):
            lock.write_text(str(other.pid))
        assert gpus.try_take(["0", "1", "2", "3"], 2, tmp_path) == []  # only GPU 1 is free
    finally:
        other.kill()
        other.wait()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # undo this process's narrowing
    assert gpus.claim(2, 1, 2, tmp_path) == ["0", "1"]  # its holder exited: free again
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
