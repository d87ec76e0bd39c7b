"""The tensor-parallel control plane on the host: the shared-memory ring, the step deadline,
cleanup on SIGTERM, and what close() means at every TP size."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import signal_soon
from tp_checkpoints import ENGINE, GREEDY, PROMPTS, assert_no_workers, build_checkpoint, is_running

from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM
from nanoexp.runner.shm_ring import CHECK_EVERY_S, ShmRing


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return build_checkpoint(tmp_path_factory.mktemp("qwen3_kv4"), "qwen3_kv4")


# ---- the ring ------------------------------------------------------------------------------------


def message(i: int) -> bytes:
    return bytes([i % 251]) * (i * 7)  # from empty to several slots' worth


def read_all(handle, rank: int, count: int, pipe, results) -> None:
    ring = ShmRing.attach(handle, rank)
    got = []
    for _ in range(count):
        data = ring.read(lambda: None, spin_s=0.0)
        got.append(pipe.recv_bytes() if data is None else data)
        time.sleep(0.001 * rank)  # readers at different speeds, so the writer must wait for the slowest
    ring.close()
    results.put((rank, got))


def test_ring_delivers_every_message_to_every_reader_in_order():
    ctx = mp.get_context("fork")  # the readers touch numpy and shared memory only; spawning re-imports torch
    count, readers = 40, 3
    ring = ShmRing.create(readers, slots=2, slot_bytes=128)
    results = ctx.Queue()
    pipes, procs = [], []
    for rank in range(readers):
        reader_end, writer_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=read_all, args=(ring.handle, rank, count, reader_end, results))
        proc.start()
        pipes.append(writer_end)
        procs.append(proc)
    overflowed = 0
    for i in range(count):
        if not ring.write(message(i), lambda: None):
            overflowed += 1
            for pipe in pipes:
                pipe.send_bytes(message(i))
    got = dict(results.get(timeout=60) for _ in range(readers))
    for proc in procs:
        proc.join(10)
    ring.close()
    assert overflowed == sum(len(message(i)) > 128 for i in range(count)) > 0
    assert all(got[rank] == [message(i) for i in range(count)] for rank in range(readers))
    assert not os.path.exists(f"/dev/shm/{ring.handle.name}")


def test_ring_writer_gives_up_when_no_reader_frees_a_slot():
    ring = ShmRing.create(1, slots=2, slot_bytes=16)

    def give_up():
        raise TimeoutError("readers stalled")

    try:
        assert ring.write(b"a", give_up) and ring.write(b"b", give_up)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="readers stalled"):
            ring.write(b"c", give_up)
        assert time.monotonic() - start < CHECK_EVERY_S + 1
    finally:
        ring.close()


# ---- the step deadline ---------------------------------------------------------------------------


def test_a_stopped_worker_fails_at_the_step_deadline_and_leaves_nothing(model, monkeypatch):
    monkeypatch.setenv("NANOEXP_TP_STEP_TIMEOUT_S", "2")
    llm = LLM(model, tensor_parallel_size=2, **{**ENGINE, "num_kv_blocks": 1024})
    group = llm.engine.executor.group
    victim, leftovers = group.procs[1].pid, (group.tmpdir, f"/dev/shm/{group.ring.handle.name}")
    stopped_at = signal_soon(victim, signal.SIGSTOP)
    long = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    pattern = r"^tensor-parallel worker rank 1 \(stopped\) did not finish within the step deadline of"
    with pytest.raises(RuntimeError, match=pattern):
        llm.generate([p[:4] for p in PROMPTS], long, use_tqdm=False)
    waited = time.monotonic() - stopped_at[0]
    assert waited < 2 + 10 * group.slowest_step_s + 5
    assert_no_workers()
    assert not any(map(os.path.exists, leftovers))
    with pytest.raises(RuntimeError, match="^the engine is closed"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    llm.close()


def test_a_bad_deadline_is_a_one_line_error(model, monkeypatch):
    monkeypatch.setenv("NANOEXP_TP_STEP_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match=r"^NANOEXP_TP_STEP_TIMEOUT_S='soon' is invalid: must be a positive"):
        LLM(model, tensor_parallel_size=2, **ENGINE)
    assert_no_workers()


# ---- SIGTERM -------------------------------------------------------------------------------------

SIGTERM_SCRIPT = """
import os, signal, sys
from nanoexp.config import SamplingParams
from nanoexp.engine.llm import LLM

def previous(signum, frame):  # runs after the engine's handler
    alive = [p.pid for p in group.procs if p.is_alive()]
    print("previous handler ran; left:", os.path.exists(group.tmpdir), alive, flush=True)
    sys.exit(7)

if sys.argv[1] == "chained":
    signal.signal(signal.SIGTERM, previous)
llm = LLM({model!r}, tensor_parallel_size=2, **{engine!r})
group = llm.engine.executor.group
print(group.tmpdir, "/dev/shm/" + group.ring.handle.name, *(p.pid for p in group.procs), flush=True)
params = SamplingParams(max_tokens=8)
llm.generate([[1, 2, 3]], params, use_tqdm=False)
print("serving", flush=True)
while True:
    llm.generate([[1, 2, 3]], params, use_tqdm=False)
"""


@pytest.mark.parametrize("handler", ["default", "chained"])
def test_sigterm_stops_the_workers_and_removes_what_they_shared(model, handler):
    script = SIGTERM_SCRIPT.format(model=model, engine=ENGINE)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, handler],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        tmpdir, ring, *pids = proc.stdout.readline().split()
        assert proc.stdout.readline() == "serving\n"
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    if handler == "default":
        assert proc.returncode == -signal.SIGTERM, err
    else:
        assert proc.returncode == 7 and "previous handler ran; left: False []" in out, (out, err)
    assert not any(is_running(int(pid)) for pid in pids)
    assert not os.path.exists(tmpdir) and not os.path.exists(ring)


# ---- close() -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2])
def test_a_closed_engine_refuses_work_at_every_tp_size(model, tp):
    with LLM(model, tensor_parallel_size=tp, **ENGINE) as llm:
        assert len(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)) == 2
    assert llm.closed
    assert_no_workers()
    for attempt in (
        lambda: llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False),
        lambda: llm.engine.add_request(PROMPTS[0], GREEDY),
        lambda: llm.engine.step(),
    ):
        with pytest.raises(RuntimeError, match="^the engine is closed$"):
            attempt()
    llm.close()
    llm.close()
