"""A job's KV-cache quality metrics: the engine's probe on a few prompts, after the timed repeats."""

from __future__ import annotations

import time

from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.schema import ConfigError, EngineKind, KvQualityConfig, NanoexpConfig

PREFIX = "kv_quality/"
SHOWN = ("greedy_agreement", "kl_mean", "kl_p99", "kl_max", "num_positions", "num_requests")


def wanted(spec: NanoexpConfig) -> bool:
    """Our engine (the baseline has no paged cache) probes a lossy cache, or any with `lossless`."""
    cfg = spec.metrics.kv_quality
    ours = spec.engine.kind is not EngineKind.hf
    return ours and cfg.num_requests > 0 and (spec.cache.lossy or cfg.lossless)


def measure_kv_quality(llm, workload: Workload, cfg: KvQualityConfig) -> dict:
    """`kv_quality/*` metrics, the cache dtype and `kv_quality_s`; long prompts are cut to fit."""
    start = time.perf_counter()
    limit = prompt_limit(llm.engine, cfg.num_tokens)
    prompts = [list(r.prompt_token_ids) for r in workload.requests[: cfg.num_requests]]
    cut = sum(len(p) > limit for p in prompts)
    result = llm.kv_cache_quality([p[:limit] for p in prompts], cfg.num_tokens)
    return {PREFIX + k: result[k] for k in SHOWN} | {
        PREFIX + "num_cut_prompts": cut,
        PREFIX + "num_tokens": cfg.num_tokens,
        "kv_quality_s": time.perf_counter() - start,
        "kv_cache_dtype": llm.engine.config.cache.kv_cache_dtype,
    }


def prompt_limit(engine, num_tokens: int, probe: str = "kv_quality") -> int:
    """The longest prompt that fits with `num_tokens` more in one prefill, max_model_len and the KV cache."""
    manager, budget = engine.block_manager, engine.config.scheduler.max_num_batched_tokens
    room = min(engine.max_model_len, budget, manager.num_blocks * manager.block_size)
    if room - num_tokens < 1:
        raise ConfigError(
            f"metrics.{probe}.num_tokens={num_tokens} is invalid: must leave room for a prompt "
            f"within {room} tokens (the least of max_model_len, max_num_batched_tokens and the KV "
            f"cache); lower it or set metrics.{probe}.num_requests=0"
        )
    return room - num_tokens
