"""Tensor-parallel start-up leaves nothing behind however it ends (the main process killed while
the workers load, a script that spawns without a `__main__` guard), and `closed` tells the truth
after a worker died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from tp_checkpoints import ENGINE, GREEDY, PROMPTS, assert_no_workers, build_checkpoint, is_running

from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return build_checkpoint(tmp_path_factory.mktemp("qwen3_kv4"), "qwen3_kv4")


def wait_until(done, timeout_s: float = 60.0) -> bool:
    """Polls `done` until it holds or a generous bound passes (never a measure of speed)."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    return done()


def leaked_rings(before: set[str]) -> list[str]:
    """Rings created since `before` whose creator (named in the ring) is no longer alive."""
    now = {p.name for p in Path("/dev/shm").glob("nanoexp-ring-*")}
    return [name for name in now - before if not is_running(int(name.split("-")[2]))]


def rings() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("nanoexp-ring-*")}


def run_script(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(source)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )


def test_closed_is_true_once_a_dead_worker_closed_the_engine(model):
    llm = LLM(model, tensor_parallel_size=2, **{**ENGINE, "num_kv_blocks": 1024})
    os.kill(llm.engine.executor.group.procs[1].pid, signal.SIGKILL)
    engine = llm.engine  # driven step by step: no generate() to close it on the way out
    engine.add_request(PROMPTS[0][:4], SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True))
    with pytest.raises(RuntimeError, match="worker rank 1 died"):
        while engine.has_unfinished():
            engine.step()
    assert llm.closed and engine.closed
    with pytest.raises(RuntimeError, match="^the engine is closed$"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    llm.close()
    assert_no_workers()


KILLED_DURING_START_UP = """
import os, signal, sys
from nanoexp.engine.llm import LLM
from nanoexp.runner import workers

start_workers = workers.WorkerGroup.start_workers

def start_then_die(group, config):
    start_workers(group, config)
    print(group.tmpdir, group.ring.handle.name, *(p.pid for p in group.procs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # while the workers are still starting

if __name__ == "__main__":
    workers.WorkerGroup.start_workers = start_then_die
    LLM(sys.argv[1], tensor_parallel_size=2, kv_block_size=16, num_kv_blocks=64)
"""


def test_workers_clean_up_when_the_main_process_is_killed_during_start_up(model, tmp_path):
    proc = run_script(tmp_path, KILLED_DURING_START_UP, model)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    tmpdir, ring, *pids = proc.stdout.split()
    assert wait_until(lambda: not any(is_running(int(p)) for p in pids)), "workers outlived their parent"
    assert wait_until(lambda: not os.path.exists(tmpdir)), "the rendezvous directory was left behind"
    assert wait_until(lambda: not os.path.exists(f"/dev/shm/{ring}")), "the ring was left behind"


NO_MAIN_GUARD = """
import sys
from nanoexp.engine.llm import LLM

llm = LLM(sys.argv[1] if len(sys.argv) > 1 else "{model}", tensor_parallel_size=2,
          kv_block_size=16, num_kv_blocks=64)
llm.close()
"""


def test_a_script_without_a_main_guard_fails_and_leaves_nothing(model, tmp_path):
    before = rings()
    proc = run_script(tmp_path, NO_MAIN_GUARD.format(model=model))
    assert proc.returncode != 0 and "__main__" in proc.stderr, proc.stderr[-3000:]
    assert list((tmp_path / "tmp").glob("nanoexp-tp-*")) == []
    # a ring another test's killed process left is removed by its janitor soon; a leak stays
    assert wait_until(lambda: leaked_rings(before) == []), leaked_rings(before)
