"""The prefill kernel's tile shape and its tile table: plain host code (no Triton), shared by the
kernel's launcher and the runner, which builds a step graph's table on the host."""

from __future__ import annotations

import numpy as np


def dim_pad(head_dim: int) -> int:
    return max(16, 1 << (head_dim - 1).bit_length())


def prefill_config(dim_pad: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) sized to fit shared memory. At head size 128 one
    shape for every length: on an H200 64 x 64 tiles beat 128 x 64 by 31% on a 512-token prompt,
    22% on 8 x 512 and 13% on one 4,096-token prompt, and are within 1% of the best shape
    swept (experiments/tools/prefill_kernel_sweep.py; the serving study's README)."""
    if dim_pad > 128:
        return 64, 32, 4, 2
    return 64, 64, 4, 3


def prefill_block_m(head_dim: int) -> int:
    """The query rows per tile that varlen_prefill runs at this head size and longest query."""
    return prefill_config(dim_pad(head_dim))[0]


def prefill_tiles(
    query_lens: np.ndarray, context_lens: np.ndarray, first_seq: int, block_m: int
) -> np.ndarray:
    """varlen_prefill's tile table for sequences first_seq.. of a packed step (those before are
    skipped, e.g. a mixed step's decodes): int32 rows (sequence, first row, query length, tile),
    the tiles that read the most keys first, so that the longest programs start in the first wave."""
    lens = np.asarray(query_lens, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)])[:-1]
    counts = -(-lens // block_m)
    counts[:first_seq] = 0
    seqs = np.repeat(np.arange(len(lens)), counts)
    first_tile = np.concatenate([[0], np.cumsum(counts)])[:-1]
    index = np.arange(len(seqs)) - np.repeat(first_tile, counts)
    prefix = np.asarray(context_lens, dtype=np.int64)[seqs] - lens[seqs]
    keys_read = np.minimum(prefix + (index + 1) * block_m, prefix + lens[seqs])
    order = np.argsort(-keys_read, kind="stable")
    return np.stack([seqs, starts[seqs], lens[seqs], index], axis=1)[order].astype(np.int32)
