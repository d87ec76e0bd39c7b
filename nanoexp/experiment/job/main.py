"""One job: resolve the config, build, warm up, run the workload, summarize, log. An error ends it
with one line (exit 2 for config errors, else 1), error.txt and results.json (in a sweep: returned)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import cast

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nanoexp.config import EngineConfig, KnobError
from nanoexp.config.checks import is_number
from nanoexp.config.engine import in_hydra_keys
from nanoexp.experiment.job import build, capacity, engine_reuse
from nanoexp.experiment.launch.gpus import claim
from nanoexp.experiment.launch.provenance import collect_provenance
from nanoexp.experiment.measure import kv_quality, request_checks, weight_quality
from nanoexp.experiment.measure.driver import EngineDriver, Progress
from nanoexp.experiment.measure.expert_load import expert_load_summary
from nanoexp.experiment.measure.repeats import measure, progress_total, repeat_specs, summarize_repeats
from nanoexp.experiment.measure.sessions import turn_metrics
from nanoexp.experiment.measure.workloads import Request, request_label
from nanoexp.experiment.metrics import registry
from nanoexp.experiment.metrics.summarize import request_rows
from nanoexp.experiment.report.job_plots import plot_timeline
from nanoexp.experiment.runtime import interrupts
from nanoexp.experiment.runtime.atomic_files import unwritable
from nanoexp.experiment.runtime.job_info import JobInfo, current_job
from nanoexp.experiment.schema import ConfigError, LoggerConfig, LoggerKind, NanoexpConfig, to_plain, to_spec
from nanoexp.experiment.sinks import local as loggers
from nanoexp.experiment.sinks.local import RESULTS_FILE, first_line, read_results, write_atomically
from nanoexp.experiment.sinks.summary_table import format_summary
from nanoexp.loader import load_tokenizer
from nanoexp.runner.peak_memory import peak_memory_bytes, reset_peak_memory

CONFIG_EXIT, RUNTIME_EXIT = 2, 1
FULL_ERROR = "HYDRA_FULL_ERROR"
CLI_FULL_ERROR = "NANOEXP_CLI_SET_HYDRA_FULL_ERROR"  # marks FULL_ERROR as set by `cli`, not the user
SUBMITIT_EXECUTOR = "SUBMITIT_EXECUTOR"  # set in the jobs submitit starts (local or slurm)
CPU = torch.device("cpu")
CONFIG_ERRORS = (ConfigError, KnobError, OmegaConfBaseException)  # KnobError: a value the engine rejects
INFEASIBLE_LOWER = 1e18  # an infeasible trial's value when the search minimizes (finite: Optuna stores it)


def main(cfg: DictConfig) -> int:
    """Run the experiment described by `cfg`; returns 0, or exits non-zero with one line."""
    job, code = None, 0
    interrupts.install()
    phrase_engine_logs()
    if os.environ.get(SUBMITIT_EXECUTOR) == "local":
        interrupts.die_with_sweep()
    try:
        job = current_job(cfg.logger)  # before the typed config, so a sweep lists its config errors
        _run_job(cfg, job)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line and an exit code
        code = _report_error(e, job)
    except KeyboardInterrupt as e:  # recorded as failed; in a sweep's own process it stops the sweep too
        interrupt = interrupts.as_interrupted(e)
        code = _report_error(interrupt, job)
        if job is not None and job.multirun and SUBMITIT_EXECUTOR not in os.environ:
            interrupt.reported = True
            raise interrupt from None
    if code and not (job and job.multirun):
        sys.exit(code)
    return code


def _run_job(cfg: DictConfig, job: JobInfo) -> None:
    logger, known = None, {}
    try:
        spec, plain = to_spec(cfg), to_plain(cfg)
        build.check(spec)
        checkpoint = build.resolve_checkpoint(spec.model)
        known = {"load_format": checkpoint.load_format}
        config = build.engine_config(spec, checkpoint)
        # GPUs first: provenance names the GPUs this job sees
        lock_dir = Path(job.sweep_dir) / ".gpu_locks" if job.sweep_dir else None
        mine = claim(spec.launch.gpus_per_job, spec.parallel.tensor_parallel_size, job.job_num, lock_dir)
        gpus = {"gpus": mine, "gpus_claimed_at": time.time()}
        gpus["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        plain["resolved"] = {"checkpoint": asdict(checkpoint), **gpus, "provenance": collect_provenance()}
        logger = build.build_logger(spec.logger)
        logger.start(plain, job)
        summary = experiment(spec, config, checkpoint, logger, job)
    except BaseException as e:
        _finish_failed(cfg, job, logger, known | _failure(e), e)
        raise
    logger.finish(summary, 0)
    table = format_summary(summary, job, plain)
    print(table, flush=True)
    append_run_log(job, table)


def experiment(
    spec: NanoexpConfig, config: EngineConfig, checkpoint: build.Checkpoint, logger, job: JobInfo
) -> dict:
    """Build, warm up, run the workload `repeats` times, summarize. Returns the flat summary."""
    spec, arch_diffs = build.adopt_checkpoint_arch(spec, checkpoint)
    tokenizer = load_tokenizer(checkpoint.path) if checkpoint.path is not None else None
    workloads = [build.build_workload(s, tokenizer) for s in repeat_specs(spec)]
    memory, start = JobMemory(), time.perf_counter()
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
        warmup_s = _warm_up(driver, workloads[0]) if spec.engine.warmup else 0.0
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
    if probed is not None:  # the unquantized model is built once the job's engine has released its memory
        quality |= weight_quality.score(probed, config, cfg)
    logger.log_requests([row for r in records for row in request_rows(r.outputs, r.t0, r.repeat, r.requests)])
    shown = [] if found else workloads  # a capacity job's records are its probe's, drawn at another rate
    plot_timeline(records, shown, job.out_dir, f"{spec.model.name}, workload {spec.workload.name}")
    if found:
        print(capacity.describe(found), flush=True)
    if spec.save_outputs:
        loggers.write_outputs(job.out_dir / "outputs.jsonl", records, tokenizer, workloads)
    request_checks.check_outputs(records, workloads)
    traced = spec.profile.trace_repeat if spec.profile.trace_steps else None
    device = "cuda" if stats.get("device") == "cuda" else "cpu"
    summary = summarize_repeats(records, spec.metrics.slo.as_dict(), spec.metrics.noise, device, traced)
    summary |= expert_load_summary(records, job.out_dir)
    summary |= turn_metrics(records) | reuse_facts | found
    summary |= {f"engine_{k}" if k in summary else k: v for k, v in stats.items()} | quality
    for name in registry.not_applicable(
        spec.engine.kind.value
    ):  # absent, not 0: transformers has no KV blocks
        summary.pop(name, None)
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
    at_capacity = {"offered_request_rate": found["capacity_request_rate"]} if found else {}
    return summary | workloads[0].facts | at_capacity


class JobMemory:
    """Memory of one job (a sweep runs its jobs in one process): weights, KV cache and the rest."""

    def __init__(self) -> None:
        reset = reset_peak_memory(CPU) == "resident"
        self.scope = "job" if reset else "process lifetime (no /proc/self/clear_refs)"
        self.rss_at_start = peak_memory_bytes(CPU) if reset else 0  # a reset peak is the resident set now
        if torch.cuda.is_initialized():  # by an earlier job of the sweep; otherwise it starts now anyway
            torch.cuda.reset_peak_memory_stats()

    def summary(self, stats: dict) -> dict:
        """The job's peak RSS (and device allocations on a GPU), split into weights, KV cache and other."""
        weights, kv = int(stats.get("weights_bytes", 0)), int(stats.get("kv_cache_bytes", 0))
        peak_rss = peak_memory_bytes(CPU)
        out = {"job_memory_scope": self.scope, "job_peak_rss_bytes": peak_rss}
        out["job_rss_at_start_bytes"] = self.rss_at_start
        used = peak_rss - self.rss_at_start
        if stats.get("device") == "cuda":
            used = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_initialized() else 0
            out["job_peak_device_bytes"] = used
        elif stats.get("kv_cache_resident_bytes") is not None:  # the CPU split counts what is resident
            kv = int(stats["kv_cache_resident_bytes"])
        out |= {"memory_weights_bytes": weights, "memory_kv_cache_bytes": kv}
        out["memory_kv_cache_allocated_bytes"] = int(stats.get("kv_cache_bytes", 0))
        return out | {"memory_other_bytes": max(0, used - weights - kv)}


def _warm_up(driver, workload) -> float:
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


def _finish_failed(cfg: DictConfig, job: JobInfo, logger, failure: dict, error: BaseException) -> None:
    """Finishes the loggers with the failure; a job that failed before they started starts them first,
    so it too leaves results (with only the local sink when the logger section is what is invalid)."""
    try:
        if logger is None:
            try:
                logger = build.build_logger(cast(LoggerConfig, OmegaConf.to_object(cfg.logger)))
            except Exception:  # noqa: BLE001 - the logger section is what is invalid: the local sink alone
                logger = build.build_logger(LoggerConfig(kind=LoggerKind.none))
            try:
                plain = to_plain(cfg)
            except Exception:  # noqa: BLE001 - resolving it is what failed: log it unresolved
                plain = cast(dict, OmegaConf.to_container(cfg, resolve=False, enum_to_str=True))
            logger.start(plain, job)
        logger.finish(failure, _exit_code(error))
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to raise
        note = f"recording the failure failed too: {_one_line(err)}"
        if sys.version_info >= (3, 11):
            error.add_note(note)
        else:  # what add_note does
            setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])  # noqa: B010 - 3.10's mypy


class HydraKeyPhrasing(logging.Filter):
    """The engine's log lines (which name `LLM(...)` keywords) phrased with the Hydra keys, as the error
    line is: `attention_backend=auto: not using triton` -> `engine.attention_backend=auto: ...`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("nanoexp.") and not record.name.startswith("nanoexp.experiment"):
            record.msg, record.args = in_hydra_keys(record.getMessage()), ()
        return True


def phrase_engine_logs() -> None:
    """Puts the phrasing on every handler of the root logger (Hydra's job logging), once."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, HydraKeyPhrasing) for f in handler.filters):
            handler.addFilter(HydraKeyPhrasing())


def _report_error(e: BaseException, job: JobInfo | None) -> int:
    """The one line (stderr and run.log), error.txt and results.json; never raises."""
    notes = [(n.strip().splitlines() or [""])[0] for n in getattr(e, "__notes__", [])]  # e.g. a logger's
    code, line = _exit_code(e), "; ".join([_one_line(e), *filter(None, notes)])
    if _user_wants_full_error():
        traceback.print_exc()
    where = ""
    if job is not None:
        with contextlib.suppress(OSError):
            job.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(job.out_dir / "error.txt", f"{line}\n\n{traceback.format_exc()}")
            where = f" (traceback: {job.out_dir / 'error.txt'})" if code == RUNTIME_EXIT else ""
            append_run_log(job, f"nanoexp: error: {line}")
        _record_failure(job, code, _failure(e, line))
    print(f"nanoexp: error: {line}{where}", file=sys.stderr)
    return code


def _record_failure(job: JobInfo, code: int, failure: dict) -> None:
    """A results.json whose status and exit code agree with the process's (the loggers' kept, if any)."""
    path, status = job.out_dir / RESULTS_FILE, "terminated" if "signal" in failure else "failed"
    written = read_results(path)  # {} when missing or unreadable
    if written.get("exit_code") == code:
        return
    summary = written.get("summary", {}) | failure
    results = written | {"status": status, "exit_code": code, "job": job.as_dict(), "summary": summary}
    with contextlib.suppress(OSError):  # else the error line on stderr is all that is left to report
        # its own temporary name: the loggers' may be what could not be written
        write_atomically(path, json.dumps(results, indent=2) + "\n", ".failure.partial")


def append_run_log(job: JobInfo, text: str) -> None:
    """Appends to `<out>/run.log`, which Hydra's job logging writes too (run.py's job is named `run`)."""
    with (job.out_dir / "run.log").open("a") as f:
        f.write(text.rstrip("\n") + "\n")


def _failure(error: BaseException, line: str | None = None) -> dict:
    """A failed job's summary: its error line and, for a job stopped by a signal, the signal's name."""
    signal = (
        {"signal": interrupts.as_interrupted(error).signal_name}
        if isinstance(error, KeyboardInterrupt)
        else {}
    )
    return {"error": _one_line(error) if line is None else line, **signal}


def _exit_code(e: BaseException) -> int:
    if isinstance(e, KeyboardInterrupt):
        return interrupts.as_interrupted(e).exit_code
    return CONFIG_EXIT if isinstance(e, CONFIG_ERRORS) else RUNTIME_EXIT


def _one_line(e: BaseException) -> str:
    """The error's first line, naming knobs by the keys run.py's users type (the engine's messages name
    its keywords); OmegaConf's errors name their key on a later line, so it leads."""
    line = in_hydra_keys(first_line(e, limit=None))
    key = getattr(e, "full_key", None) if isinstance(e, CONFIG_ERRORS) else None
    return f"{key}: {line}" if key and key not in line else line


def _user_wants_full_error() -> bool:
    return os.environ.get(FULL_ERROR) == "1" and os.environ.get(CLI_FULL_ERROR) != "1"


def objective(cfg: DictConfig) -> float:
    """What run.py returns to a search sweeper (conf/hparams_search/), read from the job's results.json."""
    hydra_cfg = HydraConfig.get()
    results = read_results(Path(hydra_cfg.runtime.output_dir) / RESULTS_FILE)
    searching = "BasicSweeper" not in str(hydra_cfg.sweeper.get("_target_", "BasicSweeper"))
    search = cast(dict, OmegaConf.to_container(cfg.search, resolve=True))
    return objective_of(results, search, say=searching)


def objective_of(results: dict, search: dict, say: bool = True) -> float:
    """`search.objective`, or `search.infeasible_value` for a failed job, a p99 TTFT above the limit, or a
    job flagged busy (infeasible by noise: its number measured the neighbour, so it is never the best)."""
    summary = results.get("summary", {})
    value = summary.get(search.get("objective", "output_throughput"))
    limit, p99 = search.get("max_p99_ttft_ms"), summary.get("p99_ttft_ms")
    too_slow = limit is not None and not (is_number(p99) and p99 <= limit)
    busy = bool(summary.get("noise_busy_repeats"))
    if busy and say and results.get("status") == "ok":  # `say`: a search sweeper reads the value
        print("nanoexp: search trial infeasible by noise (machine busy; see noise_warning)", file=sys.stderr)
    if results.get("status") != "ok" or not is_number(value) or too_slow or busy:
        return infeasible_value(search)
    return float(value)


def infeasible_value(search: dict) -> float:
    """`search.infeasible_value`; unset, the worst value of the objective's direction (0 for a rate, a
    huge latency for a metric where lower is better), so an infeasible trial is never the best."""
    chosen = search.get("infeasible_value")
    if chosen is not None:
        return float(chosen)
    return INFEASIBLE_LOWER if registry.better(search.get("objective", "")) == registry.LOWER else 0.0


def cli(app: Callable[[], object]) -> None:
    """Runs the Hydra app; a config Hydra rejects before any job starts is one line and exit 2 too."""
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
        print(f"nanoexp: error: {unwritable(e.filename or 'the output dir', e)}", file=sys.stderr)
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
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    if isinstance(e, MissingConfigException) and e.options:
        return f"{lines[0]} (available: {', '.join(e.options)})"
    if isinstance(e.__cause__, OmegaConfBaseException):
        detail = str(e.__cause__).strip().splitlines()[0]  # its key is in the override already
        return f"{lines[0].rstrip('.')}: {detail}"
    if isinstance(e, OverrideParseException) and len(lines) > 1:
        return f"{lines[0]}: {lines[1]}"
    return lines[0]
