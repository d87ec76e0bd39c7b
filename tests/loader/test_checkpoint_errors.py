"""Checkpoints that contradict their config.json, or are cut short, fail with one line naming the
tensor (or file) and the shapes; they never load with silently zeroed or misplaced rows."""

from __future__ import annotations

import json
import os

import pytest
from checkpoints import SHAPES, build_checkpoint

from nanoexp import LLM
from nanoexp.loader import CheckpointError


def edit_config(path, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        config = json.load(f)
    with open(file, "w") as f:
        json.dump(config | changes, f)


def load_error(path) -> str:
    with pytest.raises(Exception) as info:
        LLM(str(path), kv_block_size=16).close()
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


def tiny(path, shape: str = "qwen3_gqa1"):
    build_checkpoint(path, *SHAPES[shape])
    return path


def save_tensors(path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def test_a_fifo_named_model_safetensors_is_refused_without_hanging(tmp_path):
    ckpt = tiny(tmp_path / "ckpt")
    (ckpt / "model.safetensors").rename(ckpt / "real.bin")
    os.mkfifo(ckpt / "model.safetensors")  # opening it would block until a writer came
    message = load_error(ckpt)
    assert "model.safetensors is not a regular file" in message


@pytest.mark.parametrize("name", ["../outside/x.safetensors", "/abs/x.safetensors", "a/../../x.safetensors"])
def test_an_index_pointing_outside_the_checkpoint_is_refused(tmp_path, name):
    ckpt = tiny(tmp_path / "ckpt")
    (tmp_path / "outside").mkdir()
    (ckpt / "model.safetensors").rename(tmp_path / "outside" / "x.safetensors")
    index = {"weight_map": {"model.embed_tokens.weight": name}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    message = load_error(ckpt)
    assert "points outside the checkpoint directory" in message and name in message


def test_a_symlink_escaping_the_checkpoint_is_refused(tmp_path):
    ckpt = tiny(tmp_path / "ckpt")
    (tmp_path / "outside").mkdir()
    (ckpt / "model.safetensors").rename(tmp_path / "outside" / "x.safetensors")
    (ckpt / "model.safetensors").symlink_to(tmp_path / "outside" / "x.safetensors")
    assert "outside the checkpoint directory" in load_error(ckpt)


def test_a_hub_snapshot_whose_files_link_into_its_blobs_loads(tmp_path):
    repo = tmp_path / "models--org--tiny"
    snapshot = tiny(repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    (snapshot / "model.safetensors").rename(repo / "blobs" / "deadbeef")
    (snapshot / "model.safetensors").symlink_to(repo / "blobs" / "deadbeef")
    LLM(str(snapshot), kv_block_size=16).close()


def test_a_tensor_in_two_files_is_an_error_not_an_override(tmp_path):
    from safetensors.torch import load_file

    ckpt = tiny(tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    save_tensors(ckpt / "z_extra.safetensors", {"model.norm.weight": tensors["model.norm.weight"] * 0})
    message = load_error(ckpt)
    assert "model.norm.weight is in both" in message and "z_extra.safetensors" in message


def test_tensors_the_model_lacks_are_an_error(tmp_path):
    import torch

    ckpt = tiny(tmp_path / "ckpt")
    save_tensors(ckpt / "extra.safetensors", {"model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)})
    assert "does not have, e.g. ['model.layers.9.mlp.up_proj.weight']" in load_error(ckpt)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_integer_or_bool_weights_are_an_error_not_a_cast(tmp_path, dtype):
    import torch
    from safetensors.torch import load_file

    ckpt = tiny(tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(getattr(torch, dtype))
    save_tensors(ckpt / "model.safetensors", tensors)
    message = load_error(ckpt)
    assert "model.norm.weight" in message and "has dtype" in message and "F32, F16, BF16" in message


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"hidden_act": "nope"}, "hidden_act='nope' is not supported (allowed: silu)"),
        ({"rope_theta": -1, "rope_parameters": None}, "rope_theta=-1"),  # as Qwen3's own config.json
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}}, "rope_theta=-1"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps=0.0 is invalid"),
        ({"rms_norm_eps": 0}, "rms_norm_eps' expected float, got int"),
    ],
)
def test_config_values_the_model_uses_are_checked(tmp_path, changes, needle):
    ckpt = tiny(tmp_path / "ckpt")
    edit_config(ckpt, **changes)
    message = load_error(ckpt)
    assert "config.json" in message and needle in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("generation_config.json", '{"eos_token_id": ', "generation_config.json: not valid JSON"),
        ("generation_config.json", '{"eos_token_id": "x"}', "eos_token_id='x' is invalid"),
        ("model.safetensors.index.json", "{", "model.safetensors.index.json: not valid JSON"),
        ("model.safetensors.index.json", '{"metadata": {}}', 'needs "weight_map"'),
        ("config.json", '{"model_type": "qwen3",', "config.json: not valid JSON"),
        ("tokenizer.json", "{not json", "the tokenizer cannot be loaded"),
    ],
)
def test_malformed_side_files_name_the_file(tmp_path, name, text, needle):
    ckpt = tiny(tmp_path / "ckpt")
    (ckpt / name).write_text(text)
    message = load_error(ckpt)
    assert needle in message and str(ckpt) in message
