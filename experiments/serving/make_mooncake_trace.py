"""A synthetic trace in Mooncake's published format (JSONL: timestamp in ms, input_length, output_length,
hash_ids of 512-token blocks) with the statistics of its conversation trace, scaled to a short window:
long prompts (mean ~5.6k tokens, median ~5k, at most 16k; Mooncake: mean 7.6k), short answers (mean
~190; Mooncake: 182), bursty arrivals (gamma inter-arrival times, shape 0.5), and prefix reuse as in a
chat service: half the requests continue an earlier conversation (its hash_ids, then new blocks), the
others start from one of a few popular system prompts (Zipf) or none: ~53% of the prompt blocks were
seen before (Mooncake: ~50%).

    python experiments/serving/make_mooncake_trace.py --out /tmp/mooncake.jsonl --seconds 20 --rate 5

`--block-size 16 --max-output 8` shrinks it for a CPU smoke run (then `workload.trace_block_size=16`).
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from nanoexp.experiment.runtime import atomic_files

BLOCK = 512


def generate(
    seconds: float, rate: float, seed: int, block: int = BLOCK, max_output: int = 2048
) -> list[dict]:
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(0.5, 1 / (rate * 0.5), size=int(seconds * rate * 3) + 10)
    times = np.cumsum(gaps) - gaps[0]
    times = times[times < seconds]
    system = [list(range(i * 4, i * 4 + 1 + i % 4)) for i in range(8)]  # 8 system prompts of 1-4 blocks
    next_hash, conversations, rows = 64, [], []
    for t in times:
        output = int(min(max_output, max(min(8, max_output), rng.lognormal(math.log(160), 0.7))))
        if conversations and rng.random() < 0.5:  # a next turn: the conversation so far plus a message
            history = conversations[int(rng.integers(len(conversations)))]
            blocks = len(history) + math.ceil(rng.lognormal(math.log(700), 0.8) / BLOCK)
        else:  # a new conversation: a popular system prompt (Zipf) or none, then a long first message
            history = list(system[min(int(rng.zipf(1.6)) - 1, 7)]) if rng.random() < 0.7 else []
            wanted = int(min(16384, max(64, rng.lognormal(math.log(2800), 0.8))))
            blocks = max(len(history) + 1, math.ceil(wanted / BLOCK))
        blocks = min(blocks, 32)  # 16k tokens at most: a conversation that long starts over
        history = history[: blocks - 1]
        hashes = history + list(range(next_hash, next_hash + blocks - len(history)))
        next_hash += blocks - len(history)
        input_length = len(hashes) * block - int(rng.integers(0, block))
        rows.append(
            {
                "timestamp": int(round(t * 1e3)),
                "input_length": input_length,
                "output_length": output,
                "hash_ids": hashes,
            }
        )
        conversations.append(hashes + [next_hash])  # the answer's block, which the next turn repeats
        next_hash += 1
    return rows


def describe(rows: list[dict]) -> str:
    inputs = np.array([r["input_length"] for r in rows])
    outputs = np.array([r["output_length"] for r in rows])
    seen, repeated, total = set(), 0, 0
    for r in rows:
        repeated += sum(h in seen for h in r["hash_ids"])
        total += len(r["hash_ids"])
        seen.update(r["hash_ids"])
    span = rows[-1]["timestamp"] / 1e3
    rate = (len(rows) - 1) / span
    lengths = (
        f"input mean {inputs.mean():.0f} median {np.median(inputs):.0f} p99 {np.percentile(inputs, 99):.0f}"
    )
    lengths += f"; output mean {outputs.mean():.0f} median {np.median(outputs):.0f}"
    reuse = f"blocks seen before {repeated / total:.0%}"
    return f"{len(rows)} requests over {span:.1f} s ({rate:.2f} req/s); {lengths}; {reuse}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=5.0, help="mean requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=BLOCK, help="tokens a hash_ids block stands for")
    parser.add_argument("--max-output", type=int, default=2048, help="the longest answer, tokens")
    args = parser.parse_args()
    rows = generate(args.seconds, args.rate, args.seed, args.block_size, args.max_output)
    atomic_files.write_atomically(args.out, "".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {describe(rows)}")


if __name__ == "__main__":
    main()
