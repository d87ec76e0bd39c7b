"""The progress line: one tqdm line per job on a terminal (requests done, output tok/s, running /
waiting, KV usage, preemptions), nothing otherwise, redrawn a few times per second at most and
costing under 1% of the run."""

from __future__ import annotations

import io
import time

import pytest
from helpers import ROOT, TINY_JOB
from hydra import compose, initialize_config_dir

from nanoexp.experiment.job.build import build_workload, resolve_checkpoint
from nanoexp.experiment.job.engine_factory import build_llm, engine_config
from nanoexp.experiment.measure.driver import REFRESH_S, EngineDriver, Progress
from nanoexp.experiment.measure.repeats import measure, progress_total
from nanoexp.experiment.schema import to_spec
from nanoexp.experiment.sinks.local import Logger

CONF = ROOT / "conf"
TINY = [*TINY_JOB, "workload.num_requests=12"]
TINY += ["workload.output_len=32"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def engine_and_workload():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        spec = to_spec(compose(config_name="config", overrides=TINY))
    checkpoint = resolve_checkpoint(spec.model)
    llm, _ = build_llm(spec, engine_config(spec, checkpoint), checkpoint)
    yield llm, build_workload(spec)
    llm.close()


def run_with(llm, workload, progress: Progress) -> tuple[float, float]:
    """(CPU seconds spent in the progress line, seconds the timed pass took). CPU time, not wall:
    on a busy machine a redraw may wait for a core, which is not the line's cost."""
    spent, update = [0.0], progress.update

    def timed(stats, counted: bool = True) -> None:
        start = time.thread_time()
        update(stats, counted)
        spent[0] += time.thread_time() - start

    progress.update = timed
    (record,) = measure(EngineDriver(llm.engine), [workload], Logger(), progress)
    return spent[0], record.duration_s


def test_progress_line_on_a_terminal_costs_under_one_percent(engine_and_workload) -> None:
    llm, workload = engine_and_workload
    stream = Terminal()
    spent, duration = run_with(llm, workload, Progress(progress_total([workload]), True, stream))
    text = stream.getvalue()
    final = text.split("\r")[-1]
    assert "12/12" in final and "out tok/s" in final and "KV" in final and "preemptions 0" in final
    assert "running" in final and "waiting" in final
    assert text.count("\r") <= duration / REFRESH_S + 4  # a few redraws per second at most
    assert spent < 0.01 * duration, (spent, duration)


@pytest.mark.parametrize(("stream", "enabled"), [(io.StringIO(), True), (Terminal(), False)])
def test_no_progress_line_off_a_terminal_or_when_disabled(engine_and_workload, stream, enabled) -> None:
    llm, workload = engine_and_workload
    run_with(llm, workload, Progress(progress_total([workload]), enabled, stream))
    assert stream.getvalue() == ""
