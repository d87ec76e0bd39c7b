"""Checkpoint -> model parameters: safetensors (sharded per rank, packed modules) or dummy init."""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from nanoexp.layers.embed_head import VocabParallelEmbedding
from nanoexp.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, shape_of


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or a tensor whose shape config.json contradicts."""


def resolve_model_dir(model: str) -> str:
    """A local directory as is; otherwise a hub id, from the local cache or downloaded."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except Exception as err:  # noqa: BLE001 - any hub failure means "not available"
        raise FileNotFoundError(
            f"model={model!r} is neither a local checkpoint directory nor a reachable hub id "
            f"({err.__class__.__name__})"
        ) from None


def load_hf_config(model: str, overrides: dict | None) -> PretrainedConfig:
    if overrides:
        fields = dict(overrides)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    path = resolve_model_dir(model)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model={model!r} has no config.json")
    return AutoConfig.from_pretrained(path)


def checkpoint_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, name) for name in names]
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def load_safetensors(model: nn.Module, path: str) -> None:
    """Copies each checkpoint tensor (only this rank's slice of it) into its parameter."""
    files = checkpoint_files(path)
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (load_format=safetensors)")
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules_mapping", {})
    loaded: set[str] = set()
    for file in files:
        loaded |= load_file(model, params, packed, file)
    check_all_loaded(model, params, loaded)


def load_file(model: nn.Module, params: dict, packed: dict, file: str) -> set[str]:
    loaded = set()
    try:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                target = load_one(model, params, packed, name, f.get_slice(name), file)
                if target:
                    loaded.add(target)
    except (SafetensorError, OSError) as err:
        reason = " ".join(str(err).split())
        raise CheckpointError(
            f"checkpoint file {file} is unreadable (truncated or corrupt?): {reason}"
        ) from None
    return loaded


def load_one(model: nn.Module, params: dict, packed: dict, name: str, tensor, file: str) -> str | None:
    target, shard_id = packed_target(packed, name)
    if target not in params:
        return None  # e.g. rotary inv_freq buffers, or lm_head.weight of a tied model
    param = params[target]
    check_shape(model.get_submodule(target.rpartition(".")[0]), param, shard_id, shape_of(tensor), name, file)
    loader = getattr(param, "weight_loader", None)
    if shard_id is not None:
        loader(param, tensor, shard_id)
    else:
        loader(param, tensor) if loader else param.data.copy_(tensor[:])
    return target


def check_shape(
    module: nn.Module, param: nn.Parameter, shard_id, found: list[int], name: str, file: str
) -> None:
    expected = checkpoint_shape(module, param, shard_id)
    if found != expected:
        raise CheckpointError(
            f"checkpoint tensor {name} in {file} has shape {found}, but the model built from "
            f"config.json needs {expected}"
        )


def packed_target(packed: dict, name: str) -> tuple[str, str | int | None]:
    """(parameter name, shard id) of a checkpoint tensor; q/k/v and gate/up map onto fused params."""
    for source, (dest, shard_id) in packed.items():
        if f".{source}." in name:
            return name.replace(f".{source}.", f".{dest}."), shard_id
    return name, None


def checkpoint_shape(module: nn.Module, param: nn.Parameter, shard_id) -> list[int]:
    """The whole (unsharded) shape the checkpoint tensor of `param` must have."""
    local = list(param.shape)
    if isinstance(module, VocabParallelEmbedding):
        return [module.vocab_size, *local[1:]]
    if isinstance(module, QKVParallelLinear) and shard_id is not None:
        heads = module.num_heads * module.tp_size if shard_id == "q" else module.total_kv_heads
        return [heads * module.head_dim, *local[1:]]
    if isinstance(module, MergedColumnParallelLinear) and shard_id is not None:
        return [module.output_sizes[shard_id], *local[1:]]
    if isinstance(module, LinearBase) and module.tp_dim is not None and module.tp_dim < len(local):
        local[module.tp_dim] *= module.tp_size
    return local


def check_all_loaded(model: nn.Module, params: dict, loaded: set[str]) -> None:
    missing = set(params) - loaded
    if getattr(model, "tie_word_embeddings", False):
        missing -= {"lm_head.weight", "model.embed_tokens.weight"} if loaded & {
            "lm_head.weight", "model.embed_tokens.weight"} else set()
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {sorted(missing)[:3]}")


@torch.no_grad()
def init_dummy(model: nn.Module, seed: int) -> None:
    """Random weights with the real shapes; norms at 1 so activations stay in range."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.uniform_(-0.02, 0.02, generator=gen)
