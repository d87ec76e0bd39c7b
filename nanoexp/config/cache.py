"""The paged KV cache: block size, how many blocks, prefix caching, the dtype it stores."""

from __future__ import annotations

from dataclasses import dataclass

from nanoexp.config.aliases import deprecated
from nanoexp.config.checks import KnobError, boolean, choice, integer, is_int, machine_memory_gb, number

# vLLM's names: `auto` stores the model's dtype; `fp8` is an alias of `fp8_e4m3` (float8 e4m3fn
# with one scale per layer for K and one for V, calibrated at start-up).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
MAX_BLOCKS = 2**31 - 1  # block tables hold int32 block ids


@dataclass
class CacheConfig:
    block_size: int = 256  # tokens per KV block: a power of two from 1 to 1024
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory for weights, activations and KV
    num_blocks: int = -1  # -1 = as many as memory allows
    enable_prefix_caching: bool = True
    cpu_kv_cache_gib: float = 2.0  # KV cache size on the CPU, in GiB (2**30 bytes)
    kv_cache_dtype: str = "auto"  # auto (the model's dtype), fp8 or fp8_e4m3
    # deprecated spelling of cpu_kv_cache_gib (it always meant GiB): the field lets Hydra compose the old key,
    # which aliases.rename_keys moves (as from_kwargs does the keyword); here for a CacheConfig built directly
    cpu_kv_cache_gb: float | None = None

    def __post_init__(self) -> None:
        bs = self.block_size
        if not (is_int(bs) and 1 <= bs <= 1024 and bs & (bs - 1) == 0):
            raise KnobError("cache.block_size", bs, "a power of two from 1 to 1024")
        utilization = self.gpu_memory_utilization
        number("cache.gpu_memory_utilization", utilization, lambda x: 0 < x <= 1, "a number in (0, 1]")
        if self.num_blocks != -1:
            integer("cache.num_blocks", self.num_blocks, 1, " (or -1 = from memory)", high=MAX_BLOCKS)
        boolean("cache.enable_prefix_caching", self.enable_prefix_caching)
        memory = machine_memory_gb()
        allowed = f"a number in (0, {memory:.4g}] (this machine's memory in GiB)"
        if self.cpu_kv_cache_gb is not None:
            number("cache.cpu_kv_cache_gb", self.cpu_kv_cache_gb, lambda x: 0 < x <= memory, allowed)
            deprecated("cache.cpu_kv_cache_gb", "cache.cpu_kv_cache_gib")
            self.cpu_kv_cache_gib, self.cpu_kv_cache_gb = self.cpu_kv_cache_gb, None
        number("cache.cpu_kv_cache_gib", self.cpu_kv_cache_gib, lambda x: 0 < x <= memory, allowed)
        choice("cache.kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)

    @property
    def lossy(self) -> bool:
        """The cache stores K/V in fewer bits than the model computes them (fp8)."""
        return self.kv_cache_dtype != "auto"
