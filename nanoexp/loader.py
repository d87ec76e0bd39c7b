"""Checkpoint -> model parameters: safetensors (sharded per rank, packed modules) or dummy init."""

from __future__ import annotations

import os

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from nanoexp.config.checkpoint_files import CheckpointError, json_object, regular_file, safetensors_files
from nanoexp.config.checks import KnobError, is_number
from nanoexp.layers.embed_head import VocabParallelEmbedding
from nanoexp.layers.fused_moe import FusedMoE
from nanoexp.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, shape_of
from nanoexp.layers.quantization import BLOCK

WEIGHT_DTYPES = ("F32", "F16", "BF16")  # safetensors' names; weights are copied into the model dtype
ACTIVATIONS = ("silu",)  # the MLP's fused gate (layers/activation.py)
TIED = {"lm_head.weight", "model.embed_tokens.weight"}  # one tensor when tie_word_embeddings
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def resolve_model_dir(model: str) -> str:
    """A local directory as is; otherwise a hub id, from the local cache or downloaded."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    except Exception as err:  # noqa: BLE001 - any hub failure means "not available"
        raise FileNotFoundError(
            f"model={model!r} is neither a local checkpoint directory nor a reachable "
            f"hub id ({err.__class__.__name__})"
        ) from None


def load_hf_config(model: str | None, overrides: dict | None) -> PretrainedConfig:
    if overrides:
        fields = dict(overrides)
        return check_hf_config(AutoConfig.for_model(fields.pop("model_type"), **fields), ARCH_KEYWORD)
    assert model is not None, "ModelConfig requires a path or an arch"
    path = resolve_model_dir(model)
    config_file = os.path.join(path, "config.json")
    if not os.path.lexists(config_file):
        raise FileNotFoundError(f"model={model!r} has no config.json")
    json_object(config_file, path)  # a regular file of valid JSON: errors that name it
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - transformers' own checks (several lines), named
        raise CheckpointError(f"{config_file}: {' '.join(str(err).split())}") from None
    return check_hf_config(config, config_file)


ARCH_KEYWORD = "hf_config"  # LLM(hf_config=...); run.py's errors name it model.arch (config/engine.py)


def invalid(source: str, key: str, value: object, allowed: str, reason: str | None = None) -> ValueError:
    """A bad config value: a knob error (`hf_config.<key>`, exit 2 in run.py) where the user typed it, a
    checkpoint error naming the file where config.json holds it."""
    if source == ARCH_KEYWORD:
        return KnobError(f"{ARCH_KEYWORD}.{key}", value, allowed, reason)
    return CheckpointError(f"{source}: {key}={value!r} {reason or f'is invalid: must be {allowed}'}")


def check_hf_config(config: PretrainedConfig, source: str) -> PretrainedConfig:
    """The config values the model is built from, checked: one line naming `source` and the key."""
    act = getattr(config, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        allowed = ", ".join(ACTIVATIONS)
        raise invalid(source, "hidden_act", act, allowed, f"is not supported (allowed: {allowed})")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise invalid(source, "rope_type", rope_type, "default", "is not supported; only 'default' RoPE is")
    for key in ("rope_theta", "rms_norm_eps"):
        value = rope.get(key, getattr(config, key, None))
        if value is not None and not (is_number(value) and value > 0):
            raise invalid(source, key, value, "a finite number > 0")
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
    ):
        value = getattr(config, key, None)
        if not (type(value) is int and value >= 1):
            raise invalid(source, key, value, "an integer >= 1")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise invalid(source, "num_key_value_heads", kv_heads, f"a divisor of num_attention_heads={heads}")
    if getattr(config, "num_experts", None) is not None:
        check_moe_config(config, source)
    return config


def check_moe_config(config: PretrainedConfig, source: str) -> None:
    """A Qwen3-MoE config's expert fields: counts >= 1, top-k at most the experts, layer indices in range."""
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
        value = getattr(config, key, None)
        if not (type(value) is int and value >= 1):
            raise invalid(source, key, value, "an integer >= 1")
    if config.num_experts_per_tok > config.num_experts:
        top_k, allowed = config.num_experts_per_tok, f"<= num_experts={config.num_experts}"
        raise invalid(source, "num_experts_per_tok", top_k, allowed)
    layers = getattr(config, "mlp_only_layers", None) or []
    if not all(type(i) is int and 0 <= i < config.num_hidden_layers for i in layers):
        allowed = f"layer indices in [0, {config.num_hidden_layers})"
        raise invalid(source, "mlp_only_layers", layers, allowed)


def load_tokenizer(path: str):
    """A local checkpoint's tokenizer, None only when it has no tokenizer files (a tokenizer file that cannot
    be loaded is an error naming the directory, not a checkpoint "without a tokenizer"); for a hub id, the
    hub model's when one can be had, else None (a checkpoint without a tokenizer still serves token ids)."""
    from transformers import AutoTokenizer

    local = os.path.isdir(path)
    if local:
        present = [os.path.join(path, n) for n in TOKENIZER_FILES if os.path.lexists(os.path.join(path, n))]
        if not present:
            return None
        for file in present:
            regular_file(file, path)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - a hub id: no tokenizer; a local one: its files' failure, named
        if not local:
            return None
        reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [type(err).__name__])[0]}"
        raise CheckpointError(f"{path}: the tokenizer cannot be loaded ({reason})") from None


def load_safetensors(model: nn.Module, path: str, check_finite: bool = True) -> None:
    """Copies each checkpoint tensor (only this rank's slice of it) into its parameter, then checks that
    every loaded value is finite (`check_finite=False` only to time the check, experiments/reliability)."""
    files = safetensors_files(path)
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (load_format=safetensors)")
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = getattr(model, "tie_word_embeddings", False)
    sources: dict[str, list[tuple[str, str]]] = {}  # parameter -> its checkpoint tensors (name, file)
    seen: dict[str, str] = {}  # tensor name -> the file it came from
    for file in files:
        load_file(model, params, file, seen, tied, sources)
    unloaded = set(params) - set(sources)
    if tied and set(sources) & TIED:
        unloaded -= TIED
    unloaded -= {n for n in unloaded if getattr(params[n], "quantized_here", False)}  # quantized at load
    missing = sorted(unloaded) + missing_expert_tensors(model)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    if check_finite:
        check_loaded_finite(params, sources)


def missing_expert_tensors(model: nn.Module) -> list[str]:
    """Per-expert tensors of this rank's experts that no checkpoint file held (their fused parameter is
    marked loaded by any one of them)."""
    return [
        f"{name}.{piece}"
        for name, m in model.named_modules()
        if isinstance(m, FusedMoE)
        for piece in m.missing_pieces()
    ]


def check_loaded_finite(params: dict[str, nn.Parameter], sources: dict[str, list[tuple[str, str]]]) -> None:
    """A NaN or inf anywhere in the loaded weights is an error naming the checkpoint tensor and its file.
    Checked where the weights live, in the model dtype (a value that overflows it counts too): one
    reduction per parameter through which NaN and inf propagate (`finite_probe`), one host sync in all.
    Only a non-finite probe reads the parameter's checkpoint tensors again, to name the culprit; a probe
    that overflowed on finite values (real weights never do) finds none and passes."""
    names = [n for n in sources if params[n].is_floating_point()]
    if not names:
        return
    probes = torch.stack([finite_probe(params[n].detach()) for n in names])
    finite = probes.isfinite().tolist()  # the one host sync
    bad = [name for name, ok in zip(names, finite) if not ok]
    messages = (non_finite_message(n, params[n].dtype, sources[n]) for n in bad)
    message = next((m for m in messages if m), None)
    if message:
        others = f" ({len(bad) - 1} more parameter(s) hold non-finite values too)" if len(bad) > 1 else ""
        raise CheckpointError(message + others)


def finite_probe(t: torch.Tensor) -> torch.Tensor:
    """A float32 scalar that is finite iff every value of `t` is. The sum in t's own dtype is the fastest
    reduction on a CPU (bfloat16: ~30 GB/s on one core, 10x amax; float32's range); float16 would overflow
    it, so there max - min (NaN propagates through both)."""
    if t.element_size() == 1:  # fp8 weights: no reduction of their own; e4m3 holds NaN (no inf)
        t = t.to(torch.bfloat16)
    if t.dtype == torch.float16:
        low, high = torch.aminmax(t)
        return high.float() - low.float()
    return t.sum().float()


def non_finite_message(param: str, dtype: torch.dtype, tensors: list[tuple[str, str]]) -> str | None:
    """Names the first checkpoint tensor of `param` that holds NaN or inf, or overflows `dtype`; None
    when none does."""
    for name, file in tensors:
        with safe_open(file, framework="pt") as f:
            values = f.get_tensor(name).float()
        nans, infs = int(values.isnan().sum()), int(values.isinf().sum())
        if nans or infs:
            return (
                f"checkpoint tensor {name} in {file} holds {nans} NaN and {infs} inf value(s); "
                "the checkpoint is corrupt or was converted wrongly"
            )
        if not values.to(dtype).isfinite().all():
            largest = float(values.abs().max())
            return (
                f"checkpoint tensor {name} in {file} has values (|x| up to {largest:.3g}) that overflow "
                f"{str(dtype).removeprefix('torch.')}; load it in a wider dtype (dtype='float32')"
            )
    return None


def load_file(
    model: nn.Module,
    params: dict,
    file: str,
    seen: dict[str, str],
    tied: bool,
    sources: dict[str, list[tuple[str, str]]],
) -> None:
    """Loads a file's tensors (each in one file only); records which parameter each one set."""
    unused = []
    try:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if name in seen:
                    raise CheckpointError(f"checkpoint tensor {name} is in both {seen[name]} and {file}")
                seen[name] = file
                target = load_one(model, params, name, f.get_slice(name), file)
                if target:
                    sources.setdefault(target, []).append((name, file))
                # tensors a checkpoint may hold that the model computes or shares instead
                elif not (name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")):
                    unused.append(name)
    except (SafetensorError, OSError) as err:
        reason = " ".join(str(err).split())
        raise CheckpointError(
            f"checkpoint file {file} is unreadable (truncated or corrupt?): {reason}"
        ) from None
    if unused:
        raise CheckpointError(
            f"checkpoint file {file} has {len(unused)} tensor(s) the model built from "
            f"config.json does not have, e.g. {sorted(unused)[:3]}"
        )


def load_one(model: nn.Module, params: dict, name: str, tensor, file: str) -> str | None:
    """Copies one checkpoint tensor into its parameter (q/k/v and gate/up into their part of the fused
    one); the parameter's name, or None where the model has none. Checkpoints hold floating-point weights."""
    target, shard = checkpoint_target(model, name)
    param = params.get(target)
    dtype, allowed = tensor.get_dtype(), getattr(param, "checkpoint_dtypes", WEIGHT_DTYPES)
    if dtype not in allowed:
        raise CheckpointError(
            f"checkpoint tensor {name} in {file} has dtype {dtype}; "
            f"{'this tensor is' if param is not None else 'weights are'} one of {', '.join(allowed)}"
        )
    if param is None:
        return None  # the caller decides whether the model may ignore it
    expected = checkpoint_shape(model.get_submodule(target.rpartition(".")[0]), param, *shard)
    if shape_of(tensor) != expected:
        raise CheckpointError(
            f"checkpoint tensor {name} in {file} has shape {shape_of(tensor)}, but the "
            f"model built from config.json needs {expected}"
        )
    loader = getattr(param, "weight_loader", None)
    loader(param, tensor, *shard) if loader else param.data.copy_(tensor[:])
    return target


def checkpoint_target(model: nn.Module, name: str) -> tuple[str, tuple]:
    """The parameter a checkpoint tensor loads into and its part of it: a MoE expert's tensor into the fused
    experts (model.checkpoint_target), q/k/v and gate/up into their fused projection, else itself."""
    expert = getattr(model, "checkpoint_target", lambda _: None)(name)
    if expert is not None:
        return expert
    for source, (dest, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        if f".{source}." in name:
            return name.replace(f".{source}.", f".{dest}."), (shard_id,)
    return name, ()


def checkpoint_shape(module: nn.Module, param: nn.Parameter, *shard) -> list[int]:
    """The whole (unsharded) shape the checkpoint tensor of `param` must have; of a block-scaled fp8
    weight's scales, the weight's in 128 x 128 blocks."""
    if isinstance(module, FusedMoE):
        whole = module.checkpoint_shape(shard[1])
    else:
        shard_id = shard[0] if shard else None
        whole = unsharded_shape(module, getattr(param, "logical_shape", list(param.shape)), shard_id)
    return [-(-d // BLOCK) for d in whole] if getattr(param, "block_scale", False) else whole


def unsharded_shape(module: nn.Module, local: list[int], shard_id=None) -> list[int]:
    local = list(local)
    if isinstance(module, VocabParallelEmbedding):
        return [module.vocab_size, *local[1:]]
    if isinstance(module, QKVParallelLinear) and shard_id is not None:
        heads = module.num_heads * module.tp_size if shard_id == "q" else module.total_kv_heads
        return [heads * module.head_dim, *local[1:]]
    if isinstance(module, MergedColumnParallelLinear) and shard_id is not None:
        return [module.output_sizes[shard_id], *local[1:]]
    if isinstance(module, LinearBase) and module.tp_dim < len(local):
        local[module.tp_dim] *= module.tp_size
    return local


@torch.no_grad()
def init_dummy(model: nn.Module, seed: int) -> None:
    """Random weights with the real shapes; norms at 1 so activations stay in range."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        module_name, _, kind = name.rpartition(".")
        module = modules[module_name]
        fp8 = getattr(module, "fp8", None)
        if fp8 is not None and kind in {*fp8.scale_of, *fp8.scale_of.values()}:
            if kind in fp8.scale_of:  # drawn as the unquantized weight would be, then quantized
                fp8.fill_dummy(kind, param, getattr(module, fp8.scale_of[kind]), gen, model_dtype(model))
        elif "norm" in name:
            param.fill_(1.0)
        else:
            param.uniform_(-0.02, 0.02, generator=gen)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The floating-point dtype the model was built in (its norms')."""
    return next(p.dtype for p in model.parameters() if p.dtype != torch.float8_e4m3fn)
