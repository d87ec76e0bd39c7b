"""KV-cache block allocation with prefix caching (chained hashes of full blocks, ref counts)."""

from __future__ import annotations

from collections import OrderedDict

from nanoexp.config import CacheConfig
from nanoexp.engine.sequence import Sequence


class BlockManager:
    """Free blocks are evicted lazily: a freed block keeps its hash (and can still be hit) until it
    is handed out again, least recently freed first. Block state lives in lists indexed by block id,
    not in an object per block: a large cache has ~1M blocks, which garbage collections would walk."""

    def __init__(self, num_blocks: int, cache: CacheConfig):
        self.num_blocks, self.block_size = num_blocks, cache.block_size
        self.enable_prefix_caching = cache.enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.cached_hash: list[int | None] = [None] * num_blocks
        self.cached_tokens: list[tuple[int, ...]] = [()] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached block, so later prompts start cold (callers check the engine is idle)."""
        self.cached_hash = [None] * self.num_blocks
        self.cached_tokens = [()] * self.num_blocks
        self.hash_to_block.clear()

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached run of seq's full blocks (never its last token)."""
        if not self.enable_prefix_caching:
            return []
        hits, prev = [], None
        for start in range(0, len(seq) - 1 - self.block_size + 1, self.block_size):
            tokens = tuple(seq.token_ids[start : start + self.block_size])
            prev = hash((prev, tokens))  # chained: a block's hash covers the whole prefix
            block_id = self.hash_to_block.get(prev)
            if block_id is None or self.cached_tokens[block_id] != tokens:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, cached: list[int]) -> bool:
        """Room for all of seq's tokens, given the cached prefix blocks it would reuse."""
        reused_free = sum(1 for b in cached if self.ref_counts[b] == 0)
        return self.blocks_needed(len(seq)) - len(cached) + reused_free <= len(self.free)

    def allocate(self, seq: Sequence, cached: list[int]) -> None:
        """Gives an admitted sequence its cached prefix plus fresh blocks for the rest."""
        assert not seq.block_table
        for block_id in cached:
            if self.ref_counts[block_id] == 0:
                del self.free[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table = list(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.grow(seq, len(seq))

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Ensures blocks for the first `num_tokens` tokens of seq; False if out of blocks."""
        need = self.blocks_needed(num_tokens) - len(seq.block_table)
        if need > len(self.free):
            return False
        for _ in range(need):  # the least recently freed blocks, their cached content forgotten
            block_id, _ = self.free.popitem(last=False)
            old = self.cached_hash[block_id]
            if old is not None and self.hash_to_block.get(old) == block_id:
                del self.hash_to_block[old]
            self.cached_hash[block_id], self.cached_tokens[block_id], self.ref_counts[block_id] = None, (), 1
            seq.block_table.append(block_id)
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publishes seq's newly computed full blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        hashes = seq.block_hashes
        for index in range(len(hashes), seq.num_computed_tokens // self.block_size):
            block_id = seq.block_table[index]
            tokens = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
            hashes.append(hash((hashes[-1] if hashes else None, tokens)))
            if self.cached_hash[block_id] is None:
                self.cached_hash[block_id], self.cached_tokens[block_id] = hashes[-1], tokens
                self.hash_to_block.setdefault(hashes[-1], block_id)

    def unpublish(self, seq: Sequence) -> None:
        """Takes the blocks seq computed itself (not those it found cached) out of the prefix cache."""
        for block_id in seq.block_table[seq.num_cached_tokens // self.block_size :]:
            old = self.cached_hash[block_id]
            if old is not None and self.hash_to_block.get(old) == block_id:
                del self.hash_to_block[old]
            self.cached_hash[block_id], self.cached_tokens[block_id] = None, ()

    def free_seq(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            assert self.ref_counts[block_id] >= 0, "block ref count went negative"
            if self.ref_counts[block_id] == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
