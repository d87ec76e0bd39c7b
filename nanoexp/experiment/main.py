"""One job: resolve the config, build, warm up, run the workload, summarize, log.

Errors end the job with one line on stderr (config errors exit 2, others 1; the traceback goes to
error.txt in the job dir, or to the terminal with HYDRA_FULL_ERROR=1). In a multirun the job
returns its exit code instead, so the other jobs still run and the sweep report lists it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from omegaconf import DictConfig

from nanoexp.config import EngineConfig
from nanoexp.experiment.build import (
    build_driver,
    build_engine,
    build_logger,
    build_tokenizer,
    build_workload,
    check,
    engine_config,
)
from nanoexp.experiment.checkpoint import Checkpoint, check_arch, resolve_checkpoint
from nanoexp.experiment.gpus import claim, gpus_needed
from nanoexp.experiment.job import JobInfo, current_job
from nanoexp.experiment.local_sink import RESULTS_FILE
from nanoexp.experiment.metrics import request_rows
from nanoexp.experiment.outputs_file import OUTPUTS_FILE, wants_outputs, write_outputs
from nanoexp.experiment.progress import Progress
from nanoexp.experiment.repeats import measure, progress_total, repeat_specs, summarize_repeats
from nanoexp.experiment.run_log import append_run_log
from nanoexp.experiment.schema import ConfigError, NanoexpConfig, to_plain, to_spec
from nanoexp.experiment.settings import always_shown, changed_settings
from nanoexp.experiment.summary_table import print_summary

CONFIG_EXIT, RUNTIME_EXIT = 2, 1


def main(cfg: DictConfig) -> int:
    """Run the experiment described by `cfg`; returns 0, or exits non-zero with one line."""
    job, code = None, 0
    try:
        job = current_job(cfg.logger)  # before the typed config, so a sweep lists its config errors
        spec, plain = to_spec(cfg), to_plain(cfg)
        code = _run_job(spec, plain, job)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line and an exit code
        code = _report_error(e, job)
    if code and not (job and job.multirun):
        sys.exit(code)
    return code


def _run_job(spec: NanoexpConfig, plain: dict, job: JobInfo) -> int:
    check(spec)
    checkpoint = resolve_checkpoint(spec.model)
    config = engine_config(spec, checkpoint)
    plain["resolved"] = {"checkpoint": checkpoint.as_dict(), **_claim_gpus(spec, job)}
    logger = build_logger(spec)
    logger.start(plain, job)
    summary, code = {"load_format": checkpoint.load_format}, 0
    try:
        summary = experiment(spec, config, checkpoint, logger, job)
    except BaseException as e:
        code = CONFIG_EXIT if isinstance(e, ConfigError) else RUNTIME_EXIT
        summary |= {"error": _one_line(e)}
        raise
    finally:
        logger.finish(summary, code)
    table = print_summary(summary, job, always_shown(plain), changed_settings(plain, job.overrides))
    append_run_log(job, table)
    return 0


def _claim_gpus(spec: NanoexpConfig, job: JobInfo) -> dict:
    """This job's GPUs (see gpus.claim) and the CUDA_VISIBLE_DEVICES its ranks will see."""
    count = gpus_needed(spec.launch.gpus_per_job, spec.parallel.tensor_parallel_size)
    lock_dir = Path(job.sweep_dir) / ".gpu_locks" if job.multirun and job.sweep_dir else None
    claimed = claim(count, job.job_num, lock_dir)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"gpus": claimed, "cuda_visible_devices": visible, "gpus_claimed_at": time.time()}


def experiment(
    spec: NanoexpConfig, config: EngineConfig, checkpoint: Checkpoint, logger, job: JobInfo
) -> dict:
    """Build, warm up, run the workload `repeats` times, summarize. Returns the flat summary."""
    tokenizer = build_tokenizer(checkpoint)
    workloads = [build_workload(s, tokenizer) for s in repeat_specs(spec)]
    arch_diffs = check_arch(spec.model, checkpoint)
    start = time.perf_counter()
    engine = build_engine(spec, config, checkpoint)
    try:
        build_s = time.perf_counter() - start
        driver = build_driver(spec, engine)
        warmup_s = _warm_up(driver, workloads[0]) if spec.engine.warmup else 0.0
        progress = Progress(progress_total(workloads), spec.engine.use_tqdm, desc=job.name)
        records = measure(driver, workloads, logger, progress)
        stats = engine.stats()
    finally:
        engine.close()
        engine = driver = None  # drop the model and KV cache before releasing their memory
        _release_cuda_memory()
    logger.log_requests([row for r in records for row in request_rows(r.outputs, r.t0, r.repeat)])
    if wants_outputs(spec):
        write_outputs(job.out_dir / OUTPUTS_FILE, records, tokenizer)
    summary = summarize_repeats(records, spec.metrics.slo.as_dict())
    summary |= {f"engine_{k}" if k in summary else k: v for k, v in stats.items()}
    summary |= {
        "build_s": build_s,
        "bench_warmup_s": warmup_s,
        "engine_kind": spec.engine.kind.value,
        "model": spec.model.name,
        "workload": spec.workload.name,
        "load_format_requested": checkpoint.requested,
        "load_format": checkpoint.load_format,
        "checkpoint_path": checkpoint.path or "",
        "arch_mismatches": len(arch_diffs),
    }
    return summary


def _release_cuda_memory() -> None:
    """Hands a TP=1 engine's cached GPU memory back to the driver: the next job of a sequential
    sweep may be TP>1, whose rank-0 worker sizes its KV cache from the device's free memory."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _warm_up(driver, workload) -> float:
    """One short untimed request (nano-vLLM's bench does the same), so timings exclude first-call costs."""
    from dataclasses import replace

    from nanoexp.experiment.workloads import Request

    first = workload.requests[0]
    params = replace(first.sampling_params, max_tokens=min(4, first.sampling_params.max_tokens))
    start = time.perf_counter()
    driver.drive([Request(first.prompt_token_ids[:16], params)], start, lambda s: None)
    return time.perf_counter() - start


def _report_error(e: BaseException, job: JobInfo | None) -> int:
    code = CONFIG_EXIT if _is_config_error(e) else RUNTIME_EXIT
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exc()
    elif job is not None and code == RUNTIME_EXIT:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        (job.out_dir / "error.txt").write_text(traceback.format_exc())
    where = f" (traceback: {job.out_dir / 'error.txt'})" if job and code == RUNTIME_EXIT else ""
    print(f"nanoexp: error: {_one_line(e)}{where}", file=sys.stderr)
    if job is not None:
        append_run_log(job, f"nanoexp: error: {_one_line(e)}{where}")
        _record_failure(job, code, _one_line(e))
    return code


def _record_failure(job: JobInfo, code: int, error: str) -> None:
    """A results.json for jobs that failed before the logger started, so sweeps list them."""
    path = job.out_dir / RESULTS_FILE
    if not path.exists():
        job.out_dir.mkdir(parents=True, exist_ok=True)
        failed = {"status": "failed", "exit_code": code, "job": job.as_dict(), "summary": {"error": error}}
        path.write_text(json.dumps(failed, indent=2) + "\n")


def _is_config_error(e: BaseException) -> bool:
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, ConfigError | OmegaConfBaseException)


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
