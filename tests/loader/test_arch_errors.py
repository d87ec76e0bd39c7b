"""An architecture the user typed (`LLM(hf_config=...)`, run.py's `model.arch.*`) that the model cannot be
built from is a knob error naming the key, before any weight is made: it used to surface as torch's own
message from inside attention (heads that do not divide) or as a runtime failure, exit 1 in run.py. A
checkpoint's config.json with the same values stays a checkpoint error naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from checkpoints import SHAPES, build_checkpoint
from helpers import ROOT, error_lines, run_py

from nanoexp import LLM
from nanoexp.config.checks import KnobError
from nanoexp.loader import CheckpointError

TINY_ARCH = yaml.safe_load((ROOT / "conf" / "model" / "qwen3_tiny.yaml").read_text())["arch"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"num_attention_heads": 3},
            "hf_config.num_key_value_heads=2 is invalid: must be a divisor of num_attention_heads=3",
        ),
        ({"hidden_size": 0}, "hf_config.hidden_size=0 is invalid: must be an integer >= 1"),
        ({"hidden_act": "gelu"}, "hf_config.hidden_act='gelu' is not supported (allowed: silu)"),
    ],
)
def test_a_bad_arch_is_a_knob_error_naming_the_keyword(changes: dict, message: str) -> None:
    with pytest.raises(KnobError) as err:
        LLM("m", load_format="dummy", hf_config=TINY_ARCH | changes, device="cpu", dtype="float32")
    assert str(err.value) == message


def test_the_same_values_in_a_checkpoint_name_its_config_file(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    build_checkpoint(ckpt, *SHAPES["qwen3_gqa1"])
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(
        json.dumps(config | {"num_attention_heads": 3, "num_key_value_heads": 2})
    )
    with pytest.raises(
        CheckpointError, match=r"config.json: num_key_value_heads=2 is invalid: must be a divisor"
    ):
        LLM(str(ckpt), device="cpu")


@pytest.mark.slow
def test_run_py_names_the_model_arch_key_with_exit_2(tmp_path: Path) -> None:
    proc = run_py(
        tmp_path,
        "model=qwen3_tiny",
        "logger=none",
        "model.arch.num_attention_heads=3",
        f"hydra.run.dir={tmp_path / 'job'}",
    )
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    expected = "model.arch.num_key_value_heads=2 is invalid: must be a divisor of num_attention_heads=3"
    assert lines[0] == f"nanoexp: error: {expected}"
