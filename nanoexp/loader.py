"""Checkpoint -> model parameters: safetensors (sharded per rank, packed modules) or dummy init."""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, PretrainedConfig


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
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                target = load_one(params, packed, name, f.get_slice(name))
                if target:
                    loaded.add(target)
    check_all_loaded(model, params, loaded)


def load_one(params: dict, packed: dict, name: str, tensor) -> str | None:
    for source, (dest, shard_id) in packed.items():
        if f".{source}." in name:
            target = name.replace(f".{source}.", f".{dest}.")
            params[target].weight_loader(params[target], tensor, shard_id)
            return target
    if name not in params:
        return None  # e.g. rotary inv_freq buffers, or lm_head.weight of a tied model
    param = params[name]
    loader = getattr(param, "weight_loader", None)
    loader(param, tensor) if loader else param.data.copy_(tensor[:])
    return name


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
