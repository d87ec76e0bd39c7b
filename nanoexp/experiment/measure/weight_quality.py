"""A job's weight-quality metrics: with model.quantization set on an unquantized checkpoint (or dummy
weights), a few prompts are continued greedily by the job's engine after the timed repeats (its KV cache as
configured), and the same tokens are then scored by the unquantized model (its KV cache in the model dtype,
one plain prefill); `weight_quality/*` as the KV-cache probe's `kv_quality/*`. With an fp8 KV cache too, the
numbers are those of both together."""

from __future__ import annotations

import dataclasses
import time

from nanoexp.config import EngineConfig
from nanoexp.engine import weight_quality
from nanoexp.engine.llm import LLM
from nanoexp.experiment.measure.kv_quality import SHOWN, prompt_limit
from nanoexp.experiment.measure.workloads import Workload
from nanoexp.experiment.schema import EngineKind, NanoexpConfig, WeightQualityConfig

PREFIX = "weight_quality/"


def wanted(spec: NanoexpConfig) -> bool:
    cfg = spec.metrics.weight_quality
    return (
        spec.engine.kind is not EngineKind.hf and cfg.num_requests > 0 and spec.model.quantization != "none"
    )


def continue_prompts(llm, workload: Workload, cfg: WeightQualityConfig) -> dict:
    """The job's engine's greedy continuations and their log-probs (long prompts cut to fit)."""
    start = time.perf_counter()
    limit = prompt_limit(llm.engine, cfg.num_tokens, "weight_quality")
    prompts = [list(r.prompt_token_ids)[:limit] for r in workload.requests[: cfg.num_requests]]
    continuations, log_probs = llm.greedy_log_probs(prompts, cfg.num_tokens)
    return {"prompts": prompts, "continuations": continuations, "log_probs": log_probs, "start": start}


def score(probed: dict, config: EngineConfig, cfg: WeightQualityConfig) -> dict:
    """`weight_quality/*` against the unquantized model, built after the job's engine is closed."""
    with LLM.from_config(reference_config(config), use_tqdm=False) as reference:
        if reference.stats().get("weight_quantization", "none") != "none":
            return {PREFIX + "error": "the checkpoint is quantized: there is no unquantized model to compare"}
        log_probs = reference.prefill_log_probs(probed["prompts"], probed["continuations"])
    result = weight_quality.compare(log_probs, probed["log_probs"])
    return {PREFIX + k: result[k] for k in SHOWN} | {
        PREFIX + "num_tokens": cfg.num_tokens,
        "weight_quality_s": time.perf_counter() - probed["start"],
    }


def reference_config(config: EngineConfig) -> EngineConfig:
    """The job's engine config with unquantized weights, a model-dtype KV cache and no CUDA graphs."""
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, quantization="none"),
        cache=dataclasses.replace(config.cache, kv_cache_dtype="auto"),
        scheduler=dataclasses.replace(config.scheduler, enforce_eager=True),
    )
