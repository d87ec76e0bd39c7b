"""One job: resolve the config, build, warm up, run the workload, summarize, log.

Errors end the job with one line on stderr (config errors exit 2, others 1), also written to
run.log; error.txt in the job dir holds that line and the traceback (HYDRA_FULL_ERROR=1 prints
the traceback too). Every failed job still leaves results.json and, with logger=wandb, a finished
W&B run with its exit code. In a multirun the job returns its exit code instead of exiting, so
the other jobs still run and the sweep report lists it. `cli` gives configs that Hydra itself
rejects (before any job starts) the same one line and exit code 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nanoexp.config import EngineConfig
from nanoexp.experiment import interrupts, kv_quality
from nanoexp.experiment.build import (
    build_driver,
    build_llm,
    build_logger,
    build_tokenizer,
    build_workload,
    check,
    engine_config,
)
from nanoexp.experiment.checkpoint import Checkpoint, check_arch, resolve_checkpoint
from nanoexp.experiment.gpus import claim, gpus_needed
from nanoexp.experiment.job import JobInfo, current_job
from nanoexp.experiment.job_memory import JobMemory
from nanoexp.experiment.local_sink import RESULTS_FILE, write_atomically
from nanoexp.experiment.metrics import request_rows
from nanoexp.experiment.outputs_file import OUTPUTS_FILE, wants_outputs, write_outputs
from nanoexp.experiment.progress import Progress
from nanoexp.experiment.provenance import collect_provenance
from nanoexp.experiment.repeats import measure, progress_total, repeat_specs, summarize_repeats
from nanoexp.experiment.run_log import append_run_log
from nanoexp.experiment.schema import (
    ConfigError,
    LoggerConfig,
    LoggerKind,
    NanoexpConfig,
    to_plain,
    to_spec,
)
from nanoexp.experiment.settings import always_shown, changed_settings
from nanoexp.experiment.summary_table import print_summary

CONFIG_EXIT, RUNTIME_EXIT = 2, 1
ERROR_FILE = "error.txt"
FULL_ERROR = "HYDRA_FULL_ERROR"
CLI_FULL_ERROR = "NANOEXP_CLI_SET_HYDRA_FULL_ERROR"  # marks FULL_ERROR as set by `cli`, not the user
SUBMITIT_EXECUTOR = "SUBMITIT_EXECUTOR"  # set in the jobs submitit starts (local or slurm)


def main(cfg: DictConfig) -> int:
    """Run the experiment described by `cfg`; returns 0, or exits non-zero with one line."""
    job, code = None, 0
    interrupts.install()
    if os.environ.get(SUBMITIT_EXECUTOR) == "local":
        interrupts.die_with_sweep()
    try:
        job = current_job(cfg.logger)  # before the typed config, so a sweep lists its config errors
        code = _run_job(cfg, job)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line and an exit code
        code = _report_error(e, job)
    except KeyboardInterrupt as e:
        code = _stop(interrupts.as_interrupted(e), job)
    if code and not (job and job.multirun):
        sys.exit(code)
    return code


def _stop(interrupt: interrupts.Interrupted, job: JobInfo | None) -> int:
    """Records a signalled job like a failed one. A job in a sweep's own process stops the sweep
    (the sweep report lists what finished); a job in a process of its own (submitit) returns."""
    code = _report_error(interrupt, job)
    if job is not None and job.multirun and SUBMITIT_EXECUTOR not in os.environ:
        interrupt.reported = True
        raise interrupt
    return code


def _run_job(cfg: DictConfig, job: JobInfo) -> int:
    try:
        spec, plain = to_spec(cfg), to_plain(cfg)
        check(spec)
        checkpoint = resolve_checkpoint(spec.model)
        config = engine_config(spec, checkpoint)
        gpus = _claim_gpus(spec, job)  # first: provenance names the GPUs this job sees
        plain["resolved"] = {"checkpoint": checkpoint.as_dict(), **gpus, "provenance": collect_provenance()}
    except (Exception, KeyboardInterrupt) as e:
        _log_early_failure(cfg, job, e)
        raise
    logger = build_logger(spec)
    logger.start(plain, job)
    summary, code = {"load_format": checkpoint.load_format}, 0
    try:
        summary = experiment(spec, config, checkpoint, logger, job)
    except BaseException as e:
        code = _exit_code(e)
        summary |= {"error": _one_line(e), **_signal_of(e)}
        _finish_after_failure(logger, summary, code, e)
        raise
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
    memory, start = JobMemory(), time.perf_counter()
    llm = build_llm(spec, config, checkpoint)
    try:
        build_s = time.perf_counter() - start
        driver = build_driver(spec, llm)
        probe = kv_quality.wanted(spec)
        if probe:  # a num_tokens without room fails before the timed runs
            kv_quality.prompt_limit(llm.engine, spec.metrics.kv_quality.num_tokens)
        warmup_s = _warm_up(driver, workloads[0]) if spec.engine.warmup else 0.0
        progress = Progress(progress_total(workloads), spec.engine.use_tqdm, desc=job.name)
        records = measure(driver, workloads, logger, progress, spec.profile, job.out_dir)
        stats = llm.stats()
        quality = kv_quality.measure_kv_quality(llm, workloads[0], spec.metrics.kv_quality) if probe else {}
    finally:
        llm.close()
        llm = driver = None  # drop the model and KV cache before releasing their memory
        _release_cuda_memory()
    logger.log_requests([row for r in records for row in request_rows(r.outputs, r.t0, r.repeat)])
    if wants_outputs(spec):
        write_outputs(job.out_dir / OUTPUTS_FILE, records, tokenizer)
    summary = summarize_repeats(records, spec.metrics.slo.as_dict(), spec.metrics.noise)
    summary |= {f"engine_{k}" if k in summary else k: v for k, v in stats.items()} | quality
    summary |= memory.summary(stats)
    summary |= {
        "build_s": build_s,
        "bench_warmup_s": warmup_s,
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


def _finish_after_failure(logger, summary: dict, code: int, error: BaseException) -> None:
    """Finishes the loggers of a failed job; an error while finishing is noted on the job's error
    (and so reported with it) instead of replacing it."""
    try:
        logger.finish(summary, code)
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to raise
        error.add_note(f"finishing the loggers failed too: {_one_line(err)}")


def _log_early_failure(cfg: DictConfig, job: JobInfo, error: BaseException) -> None:
    """Starts and finishes the loggers of a job that failed before they started (a config error,
    a missing checkpoint), so it too leaves results.json and, with logger=wandb, a W&B run."""
    code, line = _exit_code(error), _one_line(error)
    logger = build_logger(NanoexpConfig(logger=_logger_config(cfg)))
    try:
        logger.start(_config_as_data(cfg), job)
        logger.finish({"error": line, **_signal_of(error)}, code)
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to raise
        error.add_note(f"recording the failure failed too: {_one_line(err)}")
        _record_failure(job, code, line, _signal_of(error), replace=True)


def _logger_config(cfg: DictConfig) -> LoggerConfig:
    """The job's logger settings; only the local sink when the logger section itself is invalid."""
    try:
        logger_cfg = OmegaConf.to_object(cfg.logger)
    except Exception:  # noqa: BLE001 - the job's own error is reported; this only picks loggers
        return LoggerConfig(kind=LoggerKind.none)
    return logger_cfg if isinstance(logger_cfg, LoggerConfig) else LoggerConfig(kind=LoggerKind.none)


def _config_as_data(cfg: DictConfig) -> dict:
    """The resolved config, or the unresolved one when resolving it is what failed."""
    try:
        return to_plain(cfg)
    except Exception:  # noqa: BLE001 - the unresolved config is still worth logging
        return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)


def _report_error(e: BaseException, job: JobInfo | None) -> int:
    """The one line (stderr and run.log), error.txt and results.json; never raises."""
    code, line = _exit_code(e), _error_line(e)
    if _user_wants_full_error():
        traceback.print_exc()
    where = ""
    if job is not None:
        saved = _write_error_file(job, line, traceback.format_exc())
        where = f" (traceback: {saved})" if saved and code == RUNTIME_EXIT else ""
        _record_failure(job, code, line, _signal_of(e))
    _log_to_files(f"nanoexp: error: {line}")
    print(f"nanoexp: error: {line}{where}", file=sys.stderr)
    return code


def _write_error_file(job: JobInfo, line: str, trace: str) -> Path | None:
    path = job.out_dir / ERROR_FILE
    try:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, f"{line}\n\n{trace}")
    except OSError:
        return None
    return path


def _record_failure(
    job: JobInfo, code: int, error: str, signalled: dict | None = None, replace: bool = False
) -> None:
    """A results.json whose status and exit code agree with the process's: written for jobs whose
    loggers did not write one (so sweeps list them), and rewritten, keeping its config and
    summary, when the job failed after its loggers wrote it (a full disk while appending to
    run.log, a signal while the summary printed)."""
    path = job.out_dir / RESULTS_FILE
    results = {"status": "failed", "exit_code": code, "job": job.as_dict(), "summary": {"error": error}}
    try:
        written = _read_results(path) if path.exists() and not replace else None
        if written is not None and written.get("exit_code", code) == code:
            return
        if written is not None:
            results = written | {"status": "failed", "exit_code": code}
            results["summary"] = written.get("summary", {}) | {"error": error}
        if signalled:
            results["status"] = "terminated"
            results["summary"] |= signalled
        job.out_dir.mkdir(parents=True, exist_ok=True)
        # its own temporary name: the loggers' may be what could not be written
        write_atomically(path, json.dumps(results, indent=2) + "\n", ".failure.partial")
    except OSError:
        pass  # the error line on stderr is all that is left to report


def _read_results(path: Path) -> dict | None:
    """The results.json a logger wrote; an unreadable one counts as written (it is not replaced)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _signal_of(error: BaseException) -> dict:
    """{"signal": "SIGTERM"} for a job stopped by a signal, {} otherwise."""
    if isinstance(error, KeyboardInterrupt):
        return {"signal": interrupts.as_interrupted(error).signal_name}
    return {}


def _log_to_files(message: str) -> None:
    """The error line into the job's log files (run.log), not its console handler: stderr
    already has it."""
    record = logging.LogRecord("nanoexp", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _exit_code(e: BaseException) -> int:
    if isinstance(e, KeyboardInterrupt):
        return interrupts.as_interrupted(e).exit_code
    return CONFIG_EXIT if _is_config_error(e) else RUNTIME_EXIT


def _is_config_error(e: BaseException) -> bool:
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, ConfigError | OmegaConfBaseException)


def _one_line(e: BaseException) -> str:
    """The error's first line; OmegaConf's errors name their key on a later line, so it leads."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    line = lines[0] if lines else type(e).__name__
    key = getattr(e, "full_key", None) if _is_config_error(e) else None
    return f"{key}: {line}" if key and key not in line else line


def _error_line(e: BaseException) -> str:
    """The first line of the error and of each note added to it (e.g. a logger that failed too)."""
    notes = [(n.strip().splitlines() or [""])[0] for n in getattr(e, "__notes__", [])]
    return "; ".join([_one_line(e), *filter(None, notes)])


def _user_wants_full_error() -> bool:
    return os.environ.get(FULL_ERROR) == "1" and os.environ.get(CLI_FULL_ERROR) != "1"


def cli(app: Callable[[], object]) -> None:
    """Runs the Hydra app (run.py's `main`). A config that Hydra rejects before any job starts (an
    unknown group option, an override's syntax, a value of the wrong type) is one line, exit 2,
    like the config errors found in a job; HYDRA_FULL_ERROR=1 keeps Hydra's own report."""
    from hydra.errors import HydraException

    interrupts.install()
    if _user_wants_full_error():
        app()
        return
    os.environ |= {FULL_ERROR: "1", CLI_FULL_ERROR: "1"}  # Hydra re-raises instead of reporting
    try:
        app()
    except HydraException as e:
        print(f"nanoexp: error: {_hydra_line(e)}", file=sys.stderr)
        sys.exit(CONFIG_EXIT)
    except OSError as e:  # Hydra creating the job's dir or its .hydra files (ours are caught in main)
        where = f"'{e.filename}'" if e.filename else "the output dir"
        print(
            f"nanoexp: error: cannot write {where}: {e.strerror or e} "
            "(set hydra.run.dir or hydra.sweep.dir to a writable directory)",
            file=sys.stderr,
        )
        sys.exit(RUNTIME_EXIT)
    except KeyboardInterrupt as e:  # a sweep stopped by a signal; its jobs reported themselves
        interrupt = interrupts.as_interrupted(e)
        if not getattr(interrupt, "reported", False):
            print(f"nanoexp: error: {interrupt}", file=sys.stderr)
        sys.exit(interrupt.exit_code)
    finally:
        os.environ.pop(FULL_ERROR, None)
        os.environ.pop(CLI_FULL_ERROR, None)


def _hydra_line(e: Exception) -> str:
    """Hydra's multi-line report as one line: its first line plus the detail that names the value."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    if isinstance(e, MissingConfigException) and e.options:
        return f"{lines[0]} (available: {', '.join(e.options)})"
    if isinstance(e.__cause__, OmegaConfBaseException):
        detail = str(e.__cause__).strip().splitlines()[0]  # its key is in the override already
        return f"{lines[0].rstrip('.')}: {detail}"
    if isinstance(e, OverrideParseException) and len(lines) > 1:
        return f"{lines[0]}: {lines[1]}"
    return lines[0]
