"""Host cost of sending one step's input to every tensor-parallel rank: pickle + one pipe per rank
(the old path) against pickle + one write into the shared-memory ring (nanoexp.runner.shm_ring),
and against a compact encoding (numpy columns, block tables flattened) written into the ring.

Dummy receiver processes (one per rank) read and unpickle each message, then acknowledge it on a
pipe of their own, so the writer never runs ahead. Printed per step, median over `--steps`:
`send` is what the engine spends (pickle + writes; the number the engine's step waits for) and
`delivered` is send until the last rank has the unpickled StepInput.

    PYTHONPATH=$PWD python experiments/tp_scaling/bench_step_broadcast.py --tp 2 4 8
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import random
import statistics
import time

import numpy as np

from nanoexp.runner.shm_ring import ShmRing
from nanoexp.runner.step_input import StepInput


def decode_step(num_seqs: int = 256) -> StepInput:
    rng = random.Random(0)
    tables = [rng.sample(range(100_000), rng.randint(4, 64)) for _ in range(num_seqs)]
    lens = [len(t) * 16 - rng.randint(0, 15) for t in tables]
    return StepInput(
        False,
        [rng.randrange(150_000) for _ in range(num_seqs)],
        [1] * num_seqs,
        lens,
        tables,
        list(range(num_seqs)),
        temperatures=[0.0] * num_seqs,
        top_k=[-1] * num_seqs,
        top_p=[1.0] * num_seqs,
        min_p=[0.0] * num_seqs,
        seeds=[None] * num_seqs,
        prev_sample_rows=list(range(num_seqs)),
    )


def prefill_step(num_tokens: int = 16384, num_seqs: int = 8) -> StepInput:
    rng = random.Random(1)
    per_seq = num_tokens // num_seqs
    tables = [list(range(i * per_seq // 16, (i + 1) * per_seq // 16)) for i in range(num_seqs)]
    return StepInput(
        True,
        [rng.randrange(150_000) for _ in range(num_tokens)],
        [per_seq] * num_seqs,
        [per_seq] * num_seqs,
        tables,
        list(range(num_seqs)),
        temperatures=[0.0] * num_seqs,
        top_k=[-1] * num_seqs,
        top_p=[1.0] * num_seqs,
        min_p=[0.0] * num_seqs,
        seeds=[None] * num_seqs,
    )


def encode_compact(step: StepInput) -> bytes:
    """The step as numpy columns (lists converted here, on the engine's side)."""
    tables = step.block_tables
    columns = (
        step.has_prefill,
        np.array(step.token_ids, dtype=np.int64),
        np.array(step.query_lens, dtype=np.int32),
        np.array(step.context_lens, dtype=np.int32),
        np.fromiter((b for t in tables for b in t), dtype=np.int32),
        np.fromiter(map(len, tables), dtype=np.int32, count=len(tables)),
        np.array(step.sample_seq_indices, dtype=np.int32),
        np.array(step.temperatures, dtype=np.float32),
        np.array(step.top_k, dtype=np.int32),
        np.array(step.top_p, dtype=np.float32),
        np.array(step.min_p, dtype=np.float32),
        np.array([-1 if s is None else s for s in step.seeds], dtype=np.int64),
        None if step.prev_sample_rows is None else np.array(step.prev_sample_rows, dtype=np.int32),
    )
    return pickle.dumps(("launch", columns), protocol=pickle.HIGHEST_PROTOCOL)


def nothing() -> None:
    pass


def receiver(kind: str, rank: int, source, ack) -> None:
    ring = ShmRing.attach(source, rank) if kind != "pipes" else None
    while True:
        data = ring.read(nothing, spin_s=0.05) if ring else source.recv_bytes()
        message = pickle.loads(data)
        if message is None:
            break
        ack.send_bytes(b"")
    if ring:
        ring.close()
    os._exit(0)


def measure(kind: str, tp: int, step: StepInput, steps: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    ring = ShmRing.create(tp, slot_bytes=4 << 20) if kind != "pipes" else None
    pipes, acks, procs = [], [], []
    for rank in range(tp):
        reader_end, writer_end = ctx.Pipe(duplex=False)
        ack_recv, ack_send = ctx.Pipe(duplex=False)
        source = ring.handle if ring else reader_end
        proc = ctx.Process(target=receiver, args=(kind, rank, source, ack_send))
        proc.start()
        pipes.append(writer_end)
        acks.append(ack_recv)
        procs.append(proc)
    sends, deliveries = [], []
    for i in range(steps + 3):
        start = time.perf_counter()
        if kind == "compact":
            data = encode_compact(step)
        else:
            data = pickle.dumps(("launch", (step,)), protocol=pickle.HIGHEST_PROTOCOL)
        if ring:
            ring.write(data, nothing)
        else:
            for conn in pipes:
                conn.send_bytes(data)
        sent = time.perf_counter()
        for conn in acks:
            conn.recv_bytes()
        if i >= 3:  # warm-up
            sends.append(sent - start)
            deliveries.append(time.perf_counter() - start)
    stop = pickle.dumps(None)
    if ring:
        ring.write(stop, nothing)
    else:
        for conn in pipes:
            conn.send_bytes(stop)
    for proc in procs:
        proc.join()
    if ring:
        ring.close()
    return statistics.median(sends), statistics.median(deliveries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    cases = {"decode, 256 seqs, 4-64 blocks": decode_step(), "prefill, 16k tokens": prefill_step()}
    print(f"host: {os.cpu_count()} CPUs; median of {args.steps} steps; microseconds per step\n")
    kinds = ("pipes", "ring", "compact")
    columns = " | ".join(f"{k}: send | {k}: delivered" for k in kinds)
    print(f"| step | pickled / compact bytes | TP | {columns} |")
    print("|---|---:|---:|" + "---:|" * 2 * len(kinds))
    for name, step in cases.items():
        size = len(pickle.dumps(("launch", (step,)), protocol=pickle.HIGHEST_PROTOCOL))
        compact = len(encode_compact(step))
        for tp in args.tp:
            cells = [f"{t * 1e6:.0f}" for kind in kinds for t in measure(kind, tp, step, args.steps)]
            print(f"| {name} | {size:,} / {compact:,} | {tp} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
