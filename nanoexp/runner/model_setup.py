"""One rank's model: device, dtype, process group, the model built and loaded, its attention backend."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from nanoexp.config import EngineConfig, ModelConfig
from nanoexp.config.checkpoint_files import CheckpointError, json_object
from nanoexp.config.checks import KnobError, is_int
from nanoexp.config.parallel import check_split
from nanoexp.kernels import pdl
from nanoexp.kernels.base import AttentionBackend
from nanoexp.kernels.select import (
    SkinnyGemm,
    make_attention_backend,
    make_fp8_gemm,
    make_fp8_input_kernels,
    make_moe_kernel,
    make_skinny_gemm,
    require_triton,
    triton_available,
    triton_half_precision,
)
from nanoexp.layers.activation import bind_activation_kernel
from nanoexp.layers.attention import attention_layers
from nanoexp.layers.fused_moe import bind_moe_kernel, moe_layers
from nanoexp.layers.linear import bind_gemm_backend
from nanoexp.layers.quantization import bind_fp8_gemm, building, checkpoint_method
from nanoexp.loader import init_dummy, load_hf_config, load_safetensors, resolve_model_dir
from nanoexp.models.qwen3 import Qwen3ForCausalLM
from nanoexp.models.registry import model_class

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    model: Qwen3ForCausalLM
    hf_config: PretrainedConfig
    device: torch.device
    dtype: torch.dtype
    backend: AttentionBackend
    load_s: float
    max_model_len: int  # the configured limit, or the model's own
    skinny_gemm: SkinnyGemm | None  # the Triton GEMM for decode-sized rows, or None: torch only
    swiglu_kernel: bool = False  # SwiGLU through the Triton kernel (else torch's op)
    moe_kernel: str = (
        "none"  # a MoE model's experts: "triton: ..." (how it groups) or "torch" (the reference)
    )


def set_up_model(config: EngineConfig, rank: int = 0, dist_init: str | None = None) -> LoadedModel:
    """Checks the config, joins the process group, loads this rank's shard and binds its kernels."""
    check_execution(config)
    hf_config = checked_hf_config(config)
    max_model_len = config.scheduler.model_len(hf_config.max_position_embeddings)
    device = pick_device(config.execution.device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    size = config.parallel.tensor_parallel_size
    if size > 1:
        dist_backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(dist_backend, init_method=dist_init, rank=rank, world_size=size)
    dtype = pick_dtype(config.model.dtype, hf_config, device)
    start = time.perf_counter()
    model = build_model(config, hf_config, dtype, device, max_model_len)
    load_s = time.perf_counter() - start
    layers = attention_layers(model)
    execution, cache = config.execution, config.cache
    backend = make_attention_backend(
        execution.attention_backend, device, cache.block_size, dtype, layers[0].head_dim, cache.kv_cache_dtype
    )
    for layer in layers:
        layer.backend = backend
    skinny = make_skinny_gemm(execution.gemm_backend, device, dtype)
    pdl.configure(execution.pdl, device, triton_available())
    bind_gemm_backend(model, skinny)
    fp8_gemm = make_fp8_gemm(execution.gemm_backend, device)
    bind_fp8_gemm(model, fp8_gemm, make_fp8_input_kernels(fp8_gemm))
    swiglu = swiglu_kernel(device, dtype)
    bind_activation_kernel(model, swiglu)
    moe = make_moe_kernel(device)
    bind_moe_kernel(model, moe)
    moe_kernel = "none" if not moe_layers(model) else "torch" if moe is None else moe.selection
    return LoadedModel(
        model,
        hf_config,
        device,
        dtype,
        backend,
        load_s,
        max_model_len,
        skinny,
        swiglu is not None,
        moe_kernel,
    )


def swiglu_kernel(device: torch.device, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The Triton SwiGLU where `triton_half_precision` holds, else None (torch's op)."""
    if not triton_half_precision(device, dtype):
        return None
    from nanoexp.kernels.triton_swiglu import silu_and_mul

    return silu_and_mul


def checked_hf_config(config: EngineConfig) -> PretrainedConfig:
    """The model's config, after checking that it can be split and is long enough for the config."""
    hf_config = load_hf_config(config.model.path, config.model.arch)
    parallel = config.parallel
    check_split(hf_config.to_dict(), parallel.tensor_parallel_size, parallel.expert_parallel)
    config.scheduler.model_len(hf_config.max_position_embeddings)
    return hf_config


def check_execution(config: EngineConfig) -> None:
    """The device and the explicit Triton choices, before any weights load: config errors naming the
    knob (`engine.device`, ...; the API says `device`)."""
    execution = config.execution
    device = pick_device(execution.device, 0)
    for knob in ("attention_backend", "gemm_backend"):
        if getattr(execution, knob) == "triton":
            require_triton(f"engine.{knob}", device)


def pick_device(choice: str, rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise KnobError(
            "engine.device",
            "cuda",
            "auto or cpu",
            "needs a CUDA device, and none is available; use auto or cpu",
        )
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", rank)


def pick_dtype(choice: str, hf_config: PretrainedConfig, device: torch.device) -> torch.dtype:
    """`auto`: the checkpoint's dtype (bfloat16 when it names none), except on a CPU without native
    bfloat16 arithmetic or for a 16-bit float other than bfloat16 on any CPU: float32 there."""
    if choice != "auto":
        return DTYPES[choice]
    native = hf_config.dtype if hasattr(hf_config, "dtype") else getattr(hf_config, "torch_dtype", None)
    native = native if isinstance(native, torch.dtype) else torch.bfloat16
    if device.type != "cpu":
        return native
    # A CPU with native bfloat16 (AVX512-BF16 or AMX) runs a bfloat16 decode step in about half a float32
    # one's time (experiments/cpu_path); elsewhere bfloat16 is emulated and slower.
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    native_bfloat16 = native is torch.bfloat16 and any(getattr(torch.cpu, c, lambda: False)() for c in checks)
    return native if native_bfloat16 else torch.float32


def build_model(
    config: EngineConfig,
    hf_config: PretrainedConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> Qwen3ForCausalLM:
    """This rank's shard of the model, with the checkpoint's weights or seeded random ones."""
    torch.manual_seed(config.execution.seed)
    cls = model_class(hf_config)
    if device.type == "cuda":
        check_weights_fit(config, hf_config, cls, dtype, device, max_model_len)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), building(weight_quantization(config.model, hf_config)):
            model = cls(hf_config, max_model_len, config.parallel.expert_parallel).eval()
    finally:
        torch.set_default_dtype(previous)
    if config.model.load_format == "dummy":
        init_dummy(model, config.execution.seed)
    else:
        assert config.model.path is not None  # ModelConfig: no path means dummy weights
        load_safetensors(model, resolve_model_dir(config.model.path))
    return model


def check_weights_fit(
    config: EngineConfig,
    hf_config: PretrainedConfig,
    cls: type[Qwen3ForCausalLM],
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> None:
    """One line before allocating weights that cannot fit: the model, dtype, this rank's weight bytes, the
    free GPU memory, and the tensor-parallel sizes (or a 16-bit dtype) that would fit."""
    parallel = config.parallel
    quantization = weight_quantization(config.model, hf_config)
    with torch.device("meta"), building(quantization):
        shell = cls(hf_config, max_model_len, parallel.expert_parallel)
    need = sum(p.numel() * (1 if p.element_size() == 1 else dtype.itemsize) for p in shell.parameters())
    free = torch.cuda.mem_get_info(device)[0]
    if need <= free:
        return
    size = parallel.tensor_parallel_size
    whole = need * size  # all ranks' weights (replicated parts counted per rank: a bound)
    fits = [n for n in (2, 4, 8, 16) if n > size and whole / n < 0.9 * free]
    fixes = [f"parallel.tensor_parallel_size={fits[0]}" if fits else "more GPUs than 16"]
    if dtype.itemsize > 2:
        fixes.append("model.dtype=bfloat16 (half the bytes)")
    if quantization == "none":
        fixes.append("model.quantization=fp8 (about half the bytes of bf16)")
    name = config.model.path or (hf_config.architectures or ["the model"])[0]
    dtype_name = str(dtype).removeprefix("torch.")
    weights = dtype_name if quantization == "none" else f"{quantization} ({dtype_name} elsewhere)"
    raise ValueError(
        f"model {name} does not fit: its {weights} weights take "
        f"{need / 2**30:.1f} GiB on each of {size} rank(s), the GPU has {free / 2**30:.1f} GiB free; "
        f"would fit: {' or '.join(fixes)}"
    )


def weight_quantization(model: ModelConfig, hf_config: PretrainedConfig) -> str:
    """model.quantization, or the checkpoint's own format (an FP8 checkpoint selects fp8 by itself)."""
    source = "model.arch" if model.arch is not None else f"{model.path}/config.json"
    ckpt = checkpoint_method(getattr(hf_config, "quantization_config", None), source)
    return ckpt if ckpt != "none" else model.quantization


def eos_token_ids(hf_config: PretrainedConfig, model: ModelConfig) -> list[int]:
    """The config's EOS ids plus those of generation_config.json, when the checkpoint has one."""
    ids = as_list(hf_config.eos_token_id)
    gen_path = os.path.join(model.path or "", "generation_config.json")
    if model.arch is None and model.path is not None and os.path.lexists(gen_path):
        extra = json_object(gen_path, model.path).get("eos_token_id")
        if not (extra is None or is_int(extra) or (isinstance(extra, list) and all(map(is_int, extra)))):
            allowed = "must be an int or a list of ints"
            raise CheckpointError(f"{gen_path}: eos_token_id={extra!r} is invalid: {allowed}")
        ids += as_list(extra)
    return sorted(set(ids))


def as_list(ids: int | list[int] | None) -> list[int]:
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
