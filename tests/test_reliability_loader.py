"""Checkpoints that contradict their config.json, or are cut short, fail with one line naming the
tensor (or file) and the shapes; they never load with silently zeroed or misplaced rows."""

from __future__ import annotations

import json
import os

import pytest

from nanoexp import LLM
from nanoexp.loader import CheckpointError
from tests.conftest import SHAPES, build_checkpoint


def edit_config(path, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        config = json.load(f)
    with open(file, "w") as f:
        json.dump(config | changes, f)


def load_error(path) -> str:
    with pytest.raises(Exception) as info:
        LLM(str(path), kvcache_block_size=16).close()
    message = str(info.value)
    assert "\n" not in message.strip(), message
    return message


def test_embedding_with_fewer_rows_than_config_vocab_is_an_error(tmp_path):
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa2_tied"], vocab=300)  # embedding only
    edit_config(tmp_path, vocab_size=384)
    message = load_error(tmp_path)
    assert "model.embed_tokens.weight" in message and "model.safetensors" in message
    assert "[300, 64]" in message and "[384, 64]" in message


def test_hidden_size_of_config_differs_from_weights(tmp_path):
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    edit_config(tmp_path, hidden_size=128, intermediate_size=256)
    message = load_error(tmp_path)
    assert "model.safetensors" in message and "64]" in message and "128]" in message


def test_fused_projection_shape_is_checked_per_part(tmp_path):
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa4"])
    edit_config(tmp_path, num_key_value_heads=4)  # k_proj/v_proj hold 2 heads
    message = load_error(tmp_path)
    assert "k_proj.weight" in message and "[32, 96]" in message and "[64, 96]" in message


def test_truncated_safetensors_names_the_file(tmp_path):
    build_checkpoint(tmp_path, *SHAPES["qwen3_gqa1"])
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    message = load_error(tmp_path)
    assert str(file) in message and "truncated" in message


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)
