"""Host cost of `ScheduledBatch.step_input()` (CPU, no model): one prefill step of 8 x 512 new tokens
and one decode step of 256 sequences whose inputs are samples not read yet (placeholders).

    python experiments/tools/step_input_time.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import random
import time

from nanoexp.config import SamplingParams
from nanoexp.engine.scheduler import ScheduledBatch
from nanoexp.engine.sequence import PLACEHOLDER, Sequence


def mean_us(call, repeats: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def prefill_batch(rng: random.Random) -> ScheduledBatch:
    batch = ScheduledBatch(has_prefill=True)
    for seq_id in range(8):
        seq = Sequence(seq_id, [rng.randrange(100_000) for _ in range(512)], SamplingParams())
        seq.block_table = list(range(32))
        batch.add(seq, 512)
    return batch


def decode_batch(rng: random.Random) -> ScheduledBatch:
    batch = ScheduledBatch(has_prefill=False)
    for seq_id in range(256):
        seq = Sequence(seq_id, [rng.randrange(100_000) for _ in range(600)] + [PLACEHOLDER], SamplingParams())
        seq.num_computed_tokens, seq.block_table = 600, list(range(40))
        batch.add(seq, 1)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(0)
    prefill, decode = prefill_batch(rng), decode_batch(rng)
    rows = {seq.seq_id: seq.seq_id for seq in decode.seqs}
    print(f"8 x 512 prefill: {mean_us(prefill.step_input, args.repeats):.0f} us")
    print(f"256 decodes:     {mean_us(lambda: decode.step_input(rows), args.repeats):.0f} us")


if __name__ == "__main__":
    main()
