"""The prefill kernel's tile shape and tile table, host code shared by its launcher and the runner."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PrefillTile(NamedTuple):
    rows: int  # queries x the group padded to a power of two
    keys: int
    warps: int
    stages: int


# Tiles of LARGE_TILE.rows rows (queries x the group padded to a power of two) and 32 keys on 8 warps pay
# once a step's grid holds LARGE_GRID_TILES of them (~4 an SM on an H200's 132); with fewer, their long
# causal rows end after a wave of the smaller tiles would have. H200, Qwen3-0.6B's 16 query and 8 kv heads,
# us a layer, small -> large tiles, one call (experiments/tools/prefill_kernel_sweep.py): 4,096 tokens
# (512 large tiles): 8 x 512 47.2 -> 41.3, 4 x 1,024 68.5 -> 62.2, one prompt 208.3 -> 195.6; 2,048 tokens
# (256): 4 x 512 23.1 -> 24.7, one prompt 55.7 -> 77.7. Under TP the heads of a rank count.
LARGE_TILE = PrefillTile(128, 32, 8, 2)
LARGE_GRID_TILES = 512
SMALL_TILE = PrefillTile(64, 64, 4, 3)
WIDE_HEAD_TILE = PrefillTile(64, 32, 4, 2)  # head dims over 128


def prefill_config(
    head_dim: int, num_heads: int, num_kv_heads: int, tokens: int
) -> tuple[int, int, int, int]:
    """(BLOCK_M queries, BLOCK_N keys, num_warps, num_stages) of a tile in a step of `tokens` tokens
    (a step graph's padded size), sized to fit shared memory. A program runs the query heads of one kv
    head together: BLOCK_M x group rows (the group padded to a power of two), each key tile loaded once
    for them (32 queries x 2 heads against 64 x 1 at 8 x 512 tokens: 51.0 -> 47.1 us a layer)."""
    group_pad = 1 << (num_heads // num_kv_heads - 1).bit_length()
    if head_dim > 128:
        tile = WIDE_HEAD_TILE
    elif tokens * group_pad * num_kv_heads >= LARGE_GRID_TILES * LARGE_TILE.rows:
        tile = LARGE_TILE
    else:
        tile = SMALL_TILE
    return max(1, tile.rows // group_pad), tile.keys, tile.warps, tile.stages


def prefill_block_m(head_dim: int, num_heads: int, num_kv_heads: int, tokens: int) -> int:
    """The queries per tile that varlen_prefill runs at this head size, these heads and this step size."""
    return prefill_config(head_dim, num_heads, num_kv_heads, tokens)[0]


# Up to this many tiles a Python loop builds the table faster than numpy's ~15 array operations
# (~0.7 us a tile against ~30 us in all on a 2-core VM): one prompt of up to ~1,500 tokens at 32
# queries a tile.
PYTHON_TILES = 48


def prefill_tiles(query_lens: list[int], context_lens: list[int], first_seq: int, block_m: int) -> np.ndarray:
    """varlen_prefill's int32 tile rows (sequence, first row, query length, tile) for sequences
    first_seq.. of a packed step, those reading the most keys first (they start in the first wave)."""
    query_lens, context_lens = list(query_lens), list(context_lens)
    prefill_seqs = len(query_lens) - first_seq
    if sum(query_lens[first_seq:]) // block_m + prefill_seqs <= PYTHON_TILES:
        return few_prefill_tiles(query_lens, context_lens, first_seq, block_m)
    lens = np.array(query_lens[first_seq:], dtype=np.int64)
    counts = (lens + block_m - 1) // block_m
    seq = np.repeat(np.arange(prefill_seqs), counts)
    index = np.arange(len(seq)) - (np.cumsum(counts) - counts)[seq]
    q = lens[seq]
    prefix = (np.array(context_lens[first_seq:], dtype=np.int64) - lens)[seq]
    order = np.argsort(-(prefix + np.minimum((index + 1) * block_m, q)), kind="stable")
    table = np.empty((len(seq), 4), dtype=np.int32)
    table[:, 0] = seq[order] + first_seq
    table[:, 1] = (np.cumsum(lens) - lens + sum(query_lens[:first_seq]))[seq][order]
    table[:, 2] = q[order]
    table[:, 3] = index[order]
    return table


def few_prefill_tiles(
    query_lens: list[int], context_lens: list[int], first_seq: int, block_m: int
) -> np.ndarray:
    """prefill_tiles by a Python loop (few tiles)."""
    tiles, start = [], sum(query_lens[:first_seq])
    for seq in range(first_seq, len(query_lens)):
        q = query_lens[seq]
        prefix = context_lens[seq] - q
        for index in range(-(-q // block_m)):
            tiles.append((-(prefix + min((index + 1) * block_m, q)), seq, start, q, index))
        start += q
    tiles.sort(key=lambda tile: tile[0])  # stable: ties keep sequence and tile order
    return np.array([tile[1:] for tile in tiles], dtype=np.int32).reshape(-1, 4)
