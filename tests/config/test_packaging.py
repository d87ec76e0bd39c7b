"""The packaging contract: the engine installs and runs without the experiment stack, and the
project's one torch pin lies in the range its dependencies allow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
# import name -> the distribution that provides it; none may be needed by `from nanoexp import LLM`
EXPERIMENT_STACK = {
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "wandb": "wandb",
    "optuna": "hydra-optuna-sweeper",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "scipy": "scipy",
    "submitit": "hydra-submitit-launcher",
}  # not pyyaml: transformers needs it too


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_the_experiment_stack_is_an_extra_not_a_dependency() -> None:
    project = pyproject()["project"]
    stack = set(EXPERIMENT_STACK.values())
    assert not stack & names(project["dependencies"])
    assert stack <= names(project["optional-dependencies"]["experiment"])


def test_the_torch_pin_lies_in_the_dependency_range() -> None:
    config = pyproject()
    pin = config["tool"]["nanoexp"]["torch"]
    (torch,) = [Requirement(r) for r in config["project"]["dependencies"] if Requirement(r).name == "torch"]
    assert torch.specifier.contains(pin), f"[tool.nanoexp] torch = {pin} is outside {torch}"


ENGINE_WITHOUT_EXPERIMENT_STACK = """
import sys

BLOCKED = {blocked}
for name in BLOCKED:
    sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError

for name in BLOCKED:  # the block holds
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"{{name}} imported despite the block")

from nanoexp import LLM, SamplingParams

hf_config = dict(
    model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=64, hidden_size=32,
    intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    head_dim=16, max_position_embeddings=128,
)
with LLM("tiny", hf_config=hf_config, load_format="dummy", device="cpu", dtype="float32",
         kv_block_size=16, use_tqdm=False) as llm:
    (out,) = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
print(len(out.token_ids))
"""


@pytest.mark.slow  # a fresh interpreter that imports torch and builds an engine
def test_the_engine_imports_and_generates_without_the_experiment_stack() -> None:
    script = ENGINE_WITHOUT_EXPERIMENT_STACK.format(blocked=sorted(EXPERIMENT_STACK))
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    }
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "4"
