"""Jobs through `python run.py` whose results could rest on garbage, or whose errors could point at the
wrong place: a checkpoint that disagrees with model.arch, prompts files and their lines, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoints import SHAPES, build_checkpoint
from hydra.experimental.callback import Callback

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3_tiny", "logger=none", "cache.cpu_kv_cache_gib=0.05", "engine.use_tqdm=false"]


def run_py(tmp_path: Path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    # run.py loads this module's callback by name (`tests.e2e....`), which imports the shared helpers
    env |= {"HOME": str(tmp_path / "home"), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}" if multirun else f"hydra.run.dir={tmp_path / 'job'}"
    cmd = [sys.executable, "run.py", *(["-m"] if multirun else []), where, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]


def results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "job" / "results.json").read_text())


def test_the_checkpoints_vocabulary_wins_over_model_arch_in_the_workload(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, *SHAPES["qwen3_gqa1"], vocab=509)
    proc = run_py(tmp_path, *TINY, f"model.path={ckpt}", "model.load_format=safetensors")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = results(tmp_path)["summary"]
    assert summary["arch_mismatches"] >= 2  # vocab_size and the rest of the shape
    assert "vocab_size: config.json=509 model.arch=1024" in (tmp_path / "job" / "run.log").read_text()
    with (tmp_path / "job" / "requests.csv").open() as f:
        assert len(f.readlines()) == 1 + summary["completed"]


QUICK = ["workload.output_len=2", "metrics.kv_quality.num_requests=0"]


def prompts_job(tmp_path: Path, name: str, text: str, *overrides: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(text)
    return run_py(tmp_path, *TINY, *QUICK, "workload=prompts_file", f"workload.path={path}", *overrides)


def test_outputs_name_their_source_line_and_number_requests_from_zero(tmp_path: Path) -> None:
    lines = ['{"prompt_token_ids": [5, 6, 7]}', '{"prompt_token_ids": [8, 9], "max_tokens": 3}', ""]
    proc = prompts_job(tmp_path, "p.jsonl", "\n".join(lines) + "\n\n", "repeats=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "job" / "outputs.jsonl").read_text().splitlines()]
    assert [(r["repeat"], r["request_id"], r["source_line"]) for r in rows] == [
        (0, 0, 1), (0, 1, 2), (1, 0, 1), (1, 1, 2)
    ]  # fmt: skip
    assert {r["source_file"] for r in rows} == {str(tmp_path / "p.jsonl")}
    assert [r["prompt_len"] for r in rows] == [3, 2, 3, 2]
    with (tmp_path / "job" / "requests.csv").open() as f:  # the same numbering, warm-up request absent
        assert [ln.split(",")[1] for ln in f.read().splitlines()[1:]] == ["0", "1", "0", "1"]


def test_a_blank_line_in_a_text_prompts_file_is_an_error_naming_it(tmp_path: Path) -> None:
    proc = prompts_job(tmp_path, "p.txt", "hello world\n\n   \nthe quick fox\n")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"{tmp_path / 'p.txt'}:2: a blank line" in lines[0]


def test_a_blank_line_in_jsonl_is_an_error_too(tmp_path: Path) -> None:
    proc = prompts_job(tmp_path, "p.jsonl", '{"prompt_token_ids": [5]}\n\n{"prompt_token_ids": [6]}\n')
    assert proc.returncode == 2 and f"{tmp_path / 'p.jsonl'}:2: a blank line" in error_lines(proc)[0]


def test_a_too_long_request_names_its_file_and_line(tmp_path: Path) -> None:
    long = json.dumps({"prompt_token_ids": [5] * 6000})
    proc = prompts_job(tmp_path, "p.jsonl", '{"prompt_token_ids": [5]}\n' + long + "\n")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"request 1 ({tmp_path / 'p.jsonl'}:2) has 6002 tokens" in lines[0]
    assert "max_model_len=4096" in lines[0]


def test_a_kv_cache_too_small_names_the_key_typed_and_a_real_request(tmp_path: Path) -> None:
    proc = run_py(tmp_path, *TINY, *QUICK, "cache.block_size=16", "cache.num_blocks=1")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "cache.num_blocks" in lines[0] and "num_kv_blocks" not in lines[0]
    assert lines[0].startswith("nanoexp: error: request 0: ") and "warm-up" not in lines[0]
    assert "Traceback" not in proc.stderr


def without_triton_interpreter(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    saved = os.environ.pop("TRITON_INTERPRET", None)  # conftest turns it on; a user's machine has it off
    try:
        return run_py(tmp_path, *TINY, *QUICK, *overrides)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.mark.slow
def test_unusable_device_choices_are_config_errors_in_the_key_typed(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        return  # these choices are usable there
    for override, key in [
        ("engine.attention_backend=triton", "engine.attention_backend='triton'"),
        ("engine.gemm_backend=triton", "engine.gemm_backend='triton'"),
        ("engine.device=cuda", "engine.device='cuda'"),
    ]:
        proc = without_triton_interpreter(tmp_path / override.split("=")[0], override)
        lines = error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, (override, proc.stderr[-3000:])
        assert key in lines[0] and "Traceback" not in proc.stderr, lines


@pytest.mark.slow
def test_a_job_and_a_sweep_into_an_unwritable_dir_fail_alike(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # fails the same mkdir as a read-only dir, for root too
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    env |= {"PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.run(
            [sys.executable, "run.py", *mode, f"{key}={blocker / 'out'}", *TINY, *QUICK],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )
        for mode, key in (([], "hydra.run.dir"), (["-m"], "hydra.sweep.dir"))
    ]  # fmt: skip
    for proc in procs:
        lines = error_lines(proc)
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
        assert (
            lines[0].startswith(f"nanoexp: error: cannot write '{blocker}") and "Traceback" not in proc.stderr
        )


POISON = 300  # the token whose embedding the callback below turns into NaN


class NanForToken(Callback):
    """Test-only: every step that feeds token POISON gets NaN hidden states, so NaN logits in its row
    (finite weights never do that here, so the fault is injected at run time)."""

    def on_job_start(self, config, **kwargs) -> None:
        import torch

        from nanoexp.layers import embed_head

        forward = embed_head.VocabParallelEmbedding.forward

        def poisoned(self, input_ids):
            return torch.where((input_ids == POISON).unsqueeze(-1), float("nan"), forward(self, input_ids))

        embed_head.VocabParallelEmbedding.forward = poisoned


def test_nan_logits_fail_the_job_naming_the_request_line_and_step(tmp_path: Path) -> None:
    lines = [[5, 6, 7], [8, POISON, 9], [10, 11]]
    text = "".join(json.dumps({"prompt_token_ids": ids}) + "\n" for ids in lines)
    callback = "+hydra.callbacks.nan._target_=tests.e2e.test_nothing_silently_wrong.NanForToken"
    proc = prompts_job(tmp_path, "p.jsonl", text, callback, "workload.output_len=4")
    errors = error_lines(proc)
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    where = f"request 1 ({tmp_path / 'p.jsonl'}:2): non-finite logits (NaN or inf) at engine step"
    assert where in errors[0] and "output token 1" in errors[0], errors
    assert "1 of 3 requests ended with finish_reason 'error'" in errors[0]
    rows = [json.loads(ln) for ln in (tmp_path / "job" / "outputs.jsonl").read_text().splitlines()]
    assert [(r["source_line"], r["finish_reason"], len(r["output_token_ids"])) for r in rows] == [
        (1, "length", 4), (2, "error", 0), (3, "length", 4)
    ]  # fmt: skip
    assert "non-finite logits" in rows[1]["error"]
    assert results(tmp_path)["status"] == "failed"


def test_yaml_infinity_on_the_command_line_is_one_line_saying_how_to_write_it(tmp_path: Path) -> None:
    proc = run_py(tmp_path, *TINY, "workload.request_rate=.inf")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "workload.request_rate=.inf" in lines[0] and "on the command line infinity is inf" in lines[0]
