"""Every knob is checked where it is defined, before anything runs, with its range: one line naming
the knob and what is allowed. Settings the transformers baseline cannot apply are errors too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, compose_cfg, job_env

from nanoexp import LLM
from nanoexp.config import KnobError
from nanoexp.experiment.schema import ConfigError, to_spec


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["logger.log_every_n_steps=0"], "logger.log_every_n_steps=0 is invalid: must be an integer >= 1"),
        (["logger.log_every_n_steps=-1"], "logger.log_every_n_steps=-1 is invalid"),
        (["launch.gpus_per_job=-1"], "launch.gpus_per_job=-1 is invalid: must be an integer >= 0"),
        ([f"engine.seed={2**64}"], f"engine.seed={2**64} is invalid: must be an integer in [0, {2**63 - 1}]"),
        ([f"workload.seed={2**64}"], "workload.seed="),
        (["cache.cpu_kv_cache_gib=1e12"], "this machine's memory in GiB"),
        ([f"cache.num_blocks={10**12}"], f"cache.num_blocks={10**12} is invalid: must be an integer in [1, "),
        (
            ["workload.request_rate=1e-300"],
            "workload.request_rate=1e-300 is invalid: must be a number >= 0.001",
        ),
        (["workload.burstiness=1e-300"], "workload.burstiness=1e-300 is invalid"),
        (["search.objective=nope"], "search.objective='nope' is invalid: must be one of output_throughput,"),
        (
            ["engine=hf", "parallel=tp2"],
            "parallel.tensor_parallel_size=2 is invalid: must be 1 with engine=hf",
        ),
        (
            ["engine=hf", "cache.kv_cache_dtype=fp8"],
            "cache.kv_cache_dtype='fp8' is invalid: must be 'auto' with",
        ),
        (["engine=hf", "cache.num_blocks=1"], "cache.num_blocks=1 is invalid: must be -1 with engine=hf"),
    ],
)
def test_unbounded_or_ignored_knobs_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        to_spec(compose_cfg("model=qwen3_tiny", *overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_engine_settings_a_baseline_can_apply_still_pass() -> None:
    spec = to_spec(compose_cfg("model=qwen3_tiny", "engine=hf", "scheduler.max_num_seqs=4"))
    assert spec.engine.kind.value == "hf"


@pytest.mark.slow
def test_a_bad_logging_interval_fails_before_the_benchmark_runs(tmp_path: Path) -> None:
    env = job_env(tmp_path / "home")
    job = tmp_path / "job"
    cmd = [
        sys.executable,
        "run.py",
        f"hydra.run.dir={job}",
        "model=qwen3_tiny",
        "logger=wandb",
        "logger.log_every_n_steps=0",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "logger.log_every_n_steps=0 is invalid" in proc.stderr
    assert not (job / "steps.csv").exists()  # nothing ran


def test_a_kv_cache_larger_than_the_machine_names_num_blocks(checkpoints) -> None:
    path = checkpoints["qwen3_gqa1"][0]
    with pytest.raises(KnobError, match=r"^num_kv_blocks=1000000000 is invalid: must be <= \d+"):
        LLM(path, num_kv_blocks=10**9, kv_block_size=256)  # the keyword typed


def _checks_bool(function: ast.FunctionDef) -> bool:
    """Whether the function calls isinstance(x, bool), as an int or number predicate does."""
    return any(
        isinstance(n, ast.Call) and ast.unparse(n.func) == "isinstance" and "bool" in ast.unparse(n.args[1])
        for n in ast.walk(function)
    )


def _predicates_outside_checks() -> list[str]:
    """Predicates outside nanoexp/config/checks.py that tell ints from bools themselves."""
    found = []
    for path in (ROOT / "nanoexp").rglob("*.py"):
        if path.name == "checks.py" and path.parent.name == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith(("_is", "is_"))
                and _checks_bool(node)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_one_set_of_int_and_number_predicates_and_one_dtype_map() -> None:
    assert _predicates_outside_checks() == []
    maps = [p for p in (ROOT / "nanoexp").rglob("*.py") if '"bfloat16": torch.bfloat16' in p.read_text()]
    assert [p.name for p in maps] == ["model_setup.py"]
