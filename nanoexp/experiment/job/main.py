"""One job, top to bottom: resolve the config, build the engine, warm it up, run the workload's repeats,
summarise, log. Whatever ends it early is handled in one place (failures.py): one line, exit 2 for config
errors (else 1), error.txt and results.json; in a sweep, the code is returned."""

from __future__ import annotations

import gc
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from nanoexp.config import EngineConfig
from nanoexp.experiment.job import build, capacity, engine_factory, engine_reuse
from nanoexp.experiment.job.failures import JobState, handled
from nanoexp.experiment.job.memory import JobMemory
from nanoexp.experiment.job.run_log import append_run_log
from nanoexp.experiment.launch.gpus import claim
from nanoexp.experiment.launch.provenance import collect_provenance
from nanoexp.experiment.measure import kv_quality, request_checks, weight_quality
from nanoexp.experiment.measure.driver import EngineDriver, Progress
from nanoexp.experiment.measure.expert_load import expert_load_summary
from nanoexp.experiment.measure.repeats import measure, progress_total, repeat_specs, summarize_repeats
from nanoexp.experiment.measure.sessions import turn_metrics
from nanoexp.experiment.measure.workloads import Request, Workload, request_label
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.metrics.summarize import request_rows
from nanoexp.experiment.report.job_plots import plot_timeline
from nanoexp.experiment.runtime.job_info import JobInfo
from nanoexp.experiment.schema import NanoexpConfig, to_plain, to_spec
from nanoexp.experiment.sinks import local as loggers
from nanoexp.experiment.sinks.summary_table import format_summary
from nanoexp.loader import load_tokenizer


@handled
def main(cfg: DictConfig, job: JobInfo, state: JobState) -> None:
    """Runs the experiment `cfg` describes as `job`: resolve, build, run, summarise, log (run.py calls it as
    `main(cfg)`, which returns 0 or exits non-zero; `state` tells failures.py how far the job got)."""
    spec, plain = to_spec(cfg), to_plain(cfg)
    build.check(spec)
    checkpoint = build.resolve_checkpoint(spec.model)
    state.facts = {"load_format": checkpoint.load_format}
    config = engine_factory.engine_config(spec, checkpoint)
    plain["resolved"] = resolved(spec, checkpoint, job)
    logger = state.logger = build.build_logger(spec.logger)
    logger.start(plain, job)
    summary = experiment(spec, config, checkpoint, logger, job)
    state.finish_loggers(summary)
    table = format_summary(summary, job, plain)
    print(table, flush=True)
    append_run_log(job, table)


def resolved(spec: NanoexpConfig, checkpoint: build.Checkpoint, job: JobInfo) -> dict:
    """What the config resolved to on this machine: the checkpoint, the GPUs this job claimed (first:
    provenance names the GPUs this job sees) and the provenance."""
    lock_dir = Path(job.sweep_dir) / ".gpu_locks" if job.sweep_dir else None
    mine = claim(spec.launch.gpus_per_job, spec.parallel.tensor_parallel_size, job.job_num, lock_dir)
    gpus = {"gpus": mine, "gpus_claimed_at": time.time()}
    gpus["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"checkpoint": asdict(checkpoint), **gpus, "provenance": collect_provenance()}


def experiment(
    spec: NanoexpConfig, config: EngineConfig, checkpoint: build.Checkpoint, logger, job: JobInfo
) -> dict:
    """Build, warm up, run the workload `repeats` times, summarize. Returns the flat summary."""
    spec, arch_diffs = build.adopt_checkpoint_arch(spec, checkpoint)
    tokenizer = load_tokenizer(checkpoint.path) if checkpoint.path is not None else None
    workloads = [build.build_workload(s, tokenizer) for s in repeat_specs(spec)]
    memory = JobMemory()
    measured = run_on_engine(spec, config, checkpoint, logger, job, workloads, tokenizer)
    if measured.probed is not None:  # the unquantized model is built once the job's engine is released
        measured.quality |= weight_quality.score(measured.probed, config, spec.metrics.weight_quality)
    write_requests(spec, job, logger, workloads, measured, tokenizer)
    request_checks.check_outputs(measured.records, workloads)
    summary = summarise(spec, job, measured) | memory.summary(measured.stats)
    summary |= job_facts(spec, checkpoint, measured, arch_diffs)
    found = measured.found
    at_capacity = {"offered_request_rate": found["capacity_request_rate"]} if found else {}
    return summary | workloads[0].facts | at_capacity


@dataclass
class Measured:
    """What the job's engine gave before it was released."""

    records: list  # the timed runs (driver.RunRecord), every repeat's
    stats: dict  # the engine's facts (llm.stats())
    found: dict  # a capacity job's result ({} otherwise)
    quality: dict  # the KV-cache quality probe's scores ({}: not probed)
    probed: Any  # the quantized weights' continuations, scored once the engine is released (None: no probe)
    build_s: float
    warmup_s: float
    reuse_facts: dict  # whether the engine was a sweep's earlier job's


def run_on_engine(
    spec: NanoexpConfig,
    config: EngineConfig,
    checkpoint: build.Checkpoint,
    logger,
    job: JobInfo,
    workloads: list[Workload],
    tokenizer,
) -> Measured:
    """Builds the engine (or takes over a sweep's), checks the requests fit, warms up, runs the timed
    repeats (or the capacity search) and the quality probes; then releases it and its memory."""
    start = time.perf_counter()
    lease = engine_reuse.acquire(spec, config, checkpoint, job)
    llm, driver, ok, reuse_facts = lease.llm, lease.driver, False, lease.facts
    found: dict = {}
    try:
        build_s = time.perf_counter() - start
        probe, weights_probe = kv_quality.wanted(spec), weight_quality.wanted(spec)
        if probe:  # a num_tokens without room fails before the timed runs
            kv_quality.prompt_limit(lease.engine, spec.metrics.kv_quality.num_tokens)
        request_checks.check_requests(driver, workloads)
        if weights_probe:
            kv_quality.prompt_limit(lease.engine, spec.metrics.weight_quality.num_tokens, "weight_quality")
        warmup_s = warm_up(driver, workloads[0]) if spec.engine.warmup else 0.0
        if spec.capacity.enabled:  # each probe has its own progress line and logs
            records, found = capacity.search(spec, driver, lambda s: build.build_workload(s, tokenizer), job)
        else:
            progress = Progress(progress_total(workloads), spec.engine.use_tqdm, desc=job.name)
            records = measure(driver, workloads, logger, progress, spec.profile, job.out_dir)
        stats = llm.stats()
        quality = kv_quality.measure_kv_quality(llm, workloads[0], spec.metrics.kv_quality) if probe else {}
        cfg = spec.metrics.weight_quality
        probed = weight_quality.continue_prompts(llm, workloads[0], cfg) if weights_probe else None
        ok = True
    finally:
        lease.release(ok)  # kept for the sweep's next job, or closed
        # drop the model and KV cache and hand their memory back: the next job may size its cache from it
        del llm, driver, lease
        gc.collect()
        torch.cuda.empty_cache()  # a no-op without CUDA
    return Measured(records, stats, found, quality, probed, build_s, warmup_s, reuse_facts)


def warm_up(driver, workload: Workload) -> float:
    """One short untimed request (as nano-vLLM's bench), so timings exclude first-call costs; it has no
    number of its own (outputs and errors number the workload's requests only)."""
    first = workload.requests[0]
    params = replace(first.sampling_params, max_tokens=min(4, first.sampling_params.max_tokens))
    warm = Request(first.prompt_token_ids[:16], params)
    if isinstance(driver, EngineDriver):
        driver.check([warm], lambda i, r: f"the untimed warm-up request (from {request_label(0, first)})")
    start = time.perf_counter()
    driver.drive([warm], start, lambda s: None)
    return time.perf_counter() - start


def write_requests(
    spec: NanoexpConfig, job: JobInfo, logger, workloads: list[Workload], measured: Measured, tokenizer
) -> None:
    """Every request's row to the loggers, the timeline plot, the capacity found, outputs.jsonl."""
    records, found = measured.records, measured.found
    logger.log_requests([row for r in records for row in request_rows(r.outputs, r.t0, r.repeat, r.requests)])
    shown = [] if found else workloads  # a capacity job's records are its probe's, drawn at another rate
    plot_timeline(records, shown, job.out_dir, f"{spec.model.name}, workload {spec.workload.name}")
    if found:
        print(capacity.describe(found), flush=True)
    if spec.save_outputs:
        loggers.write_outputs(job.out_dir / "outputs.jsonl", records, tokenizer, workloads)


def summarise(spec: NanoexpConfig, job: JobInfo, measured: Measured) -> dict:
    """The repeats' metrics, with the engine's facts and the quality probes' scores."""
    records, stats = measured.records, measured.stats
    traced = spec.profile.trace_repeat if spec.profile.trace_steps else None
    device = "cuda" if stats.get("device") == "cuda" else "cpu"
    summary = summarize_repeats(records, spec.metrics.slo.as_dict(), spec.metrics.noise, device, traced)
    summary |= expert_load_summary(records, job.out_dir)
    summary |= turn_metrics(records) | measured.reuse_facts | measured.found
    summary |= {f"engine_{k}" if k in summary else k: v for k, v in stats.items()} | measured.quality
    # absent, not 0: the transformers baseline has no KV blocks
    for name in registry.not_applicable(spec.engine.kind.value):
        summary.pop(name, None)
    return summary


def job_facts(
    spec: NanoexpConfig, checkpoint: build.Checkpoint, measured: Measured, arch_diffs: list
) -> dict:
    """What ran: the times to build and warm up, the engine, model, workload and weights."""
    return {
        "build_s": measured.build_s,
        "bench_warmup_s": measured.warmup_s,
        "engine_kind": spec.engine.kind.value,
        "model": spec.model.name,
        "workload": spec.workload.name,
        "offered_request_rate": spec.workload.request_rate,  # achieved: request_throughput
        "max_concurrency": spec.workload.max_concurrency,
        "load_format_requested": checkpoint.requested,
        "load_format": checkpoint.load_format,
        "checkpoint_path": checkpoint.path or "",
        "arch_mismatches": len(arch_diffs),
    }
