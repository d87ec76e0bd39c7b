"""Every `python run.py ...` command written in the docs (README, CONTRIBUTING, docs/, the studies under
experiments/) still composes and types as written and uses no deprecated spelling (nanoexp/config/aliases.py
warns; here a warning fails): a renamed key or preset cannot leave a stale command behind.

Hydra's own override parser reads each override. One job of the command (each swept key at its first
value) is composed as run.py composes it and typed by `to_spec`, which rejects what a job would reject
before it starts (an unknown key, a value out of range); each other value of a sweep is then tried once in
that job (every preset and value the command names, without the sweep's product). Commands holding a shell
variable (`$D`, `$PWD`) or a placeholder (`<dir>`, `...`) are not whole commands: they are skipped, and
counted (printed per doc with -s). Hydra's own keys (`hydra.sweep.dir=...`, `hydra/launcher=...`) compose
too, so a misspelled one fails as well. run.py starts in the repository root, and so does each check: a
relative path in a command is read from there."""

from __future__ import annotations

import copy
import functools
import logging
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, compose_cfg
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nanoexp.experiment.schema import to_spec

DOCS = sorted(
    {ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")}
    | {p for p in (ROOT / "experiments").rglob("*.md") if "runs" not in p.relative_to(ROOT).parts}
)
COMMAND = re.compile(r"(?<![\w./-])python3? run\.py(?![\w.])")
# where a shell command ends: a separator or pipe, a comment, the closing backtick of inline code
END = re.compile(r"`|;|&&|\|| #")
PLACEHOLDER = re.compile(r"\$|<[^<>]*>|\.\.\.|…")
# Hydra's flags that print instead of running (--cfg job, --help): what they print is the job's config
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p"}
FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--resolve", "--info", "-i"}
INFO_TOPICS = {
    "all",
    "config",
    "defaults",
    "defaults-tree",
    "plugins",
    "searchpath",
}  # --info's optional value
CONFIG_NAME = {"-cn", "--config-name"}
# files a doc's earlier step writes (git-ignored): where missing, the command gets a stand-in of the same kind
WRITTEN_BY_AN_EARLIER_STEP = {  # experiments/kv_fp8/train_tiny.py, run first by the fp8 and kv_fp8 studies
    "experiments/kv_fp8/checkpoint/prompts.jsonl": '{"prompt": "Once upon a time", "max_tokens": 4}\n',
}
parser = OverridesParser.create()


@dataclass
class DocCommand:
    line: int  # 1-based, where `python run.py` starts
    text: str  # the command as one line, continuations joined

    def where(self, doc: Path) -> str:
        return f"{doc.relative_to(ROOT)}:{self.line}: `{self.text}`"


def fenced_lines(text: str) -> set[int]:
    """0-based numbers of the lines inside ``` or ~~~ fences (a backtick there is no inline code)."""
    inside, fence, lines = set(), None, text.splitlines()
    for i, line in enumerate(lines):
        mark = re.match(r"\s*(```|~~~)", line)
        if mark and (fence is None or mark.group(1) == fence):
            fence = None if fence else mark.group(1)
        elif fence:
            inside.add(i)
    return inside


def commands_in(text: str) -> list[DocCommand]:
    """Each `python run.py ...` of a markdown text, with shell continuations (`\\` at a line's end) joined.
    Inside inline code (an odd number of backticks before it on its line, outside fences) the command runs
    to the closing backtick even across a line break, as markdown reads a code span; elsewhere a line break
    without `\\` ends it."""
    fenced, found = fenced_lines(text), []
    for match in COMMAND.finditer(text):
        start_of_line = text.rfind("\n", 0, match.start()) + 1
        line = text.count("\n", 0, match.start())
        inline = line not in fenced and text.count("`", start_of_line, match.start()) % 2 == 1
        rest = text[match.start() :].split("\n\n", 1)[0]  # a paragraph ends any command
        if not inline:
            rest = re.split(r"(?<!\\)\n", rest, maxsplit=1)[0]
        rest = re.sub(r"\\\n", " ", rest).replace("\n", " ")
        command = END.split(rest, maxsplit=1)[0]
        found.append(DocCommand(line + 1, " ".join(command.split())))
    return found


@dataclass
class Job:
    config_name: str
    values: list[list[str]]  # per override, one override string per value (a sweep's first value first)
    multirun: bool  # -m given

    def first(self) -> tuple[str, ...]:
        return tuple(values[0] for values in self.values)

    def other_values(self) -> list[tuple[int, str]]:
        """(override index, override string) of each value of a sweep after its first."""
        return [(i, value) for i, values in enumerate(self.values) for value in values[1:]]


def parse(command: str, stand_ins: dict[str, str]) -> Job:
    """The flags read and the overrides parsed by Hydra; a value named in `stand_ins` becomes its stand-in."""
    args, job, overrides = shlex.split(command)[2:], Job("config", [], multirun=False), []
    while args:
        arg = args.pop(0)
        name, _, value = arg.partition("=")
        if name in FLAGS_WITH_VALUE | CONFIG_NAME and not value:
            value = args.pop(0)
        if arg in {"--info", "-i"} and args and args[0] in INFO_TOPICS:
            args.pop(0)
        if name in CONFIG_NAME:
            job.config_name = value
        elif arg in {"-m", "--multirun"}:
            job.multirun = True
        elif arg.startswith("-") and name not in FLAGS | FLAGS_WITH_VALUE:
            raise ValueError(f"{arg}: a flag this test does not know; teach it what the flag does")
        elif not arg.startswith("-"):
            overrides.append(arg)
    for override in parser.parse_overrides(overrides):
        job.values.append([stand_in(value, stand_ins) for value in dict.fromkeys(values_of(override))])
    return job


def values_of(override: Override) -> list[str]:
    """The override as it is, or one override string per value of its sweep (choice or range)."""
    if not override.is_sweep_override():
        return [str(override.input_line)]
    return [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]


def stand_in(override: str, stand_ins: dict[str, str]) -> str:
    key, _, value = override.partition("=")
    return f"{key}={stand_ins[value]}" if value in stand_ins else override


def sweeps_without_multirun(job: Job) -> bool:
    """A sweep needs -m unless the config itself sets hydra.mode (as hparams_search does); else Hydra stops
    with "Ambiguous value for argument"."""
    if job.multirun or all(len(values) == 1 for values in job.values):
        return False
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name=job.config_name, overrides=list(job.first()), return_hydra_config=True)
    return cfg.hydra.mode != RunMode.MULTIRUN


class Warnings(logging.Handler):
    """The warnings logged while it is attached (the deprecation lines of nanoexp/config/aliases.py)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@functools.cache
def composed(overrides: tuple[str, ...]) -> DictConfig:
    return compose_cfg(*overrides)  # cached: the docs repeat commands


def job_problem(overrides: tuple[str, ...], value: Override | None = None) -> str | None:
    """None when the job (with `value` set as Hydra sets a key's value) composes and types without a
    warning; else what went wrong."""
    warnings, root = Warnings(), logging.getLogger()
    root.addHandler(warnings)
    try:
        cfg = copy.deepcopy(composed(overrides))
        if value is not None:  # what compose would do with it, without composing again
            OmegaConf.update(cfg, value.key_or_group, value.value(), merge=True)
        to_spec(cfg)
    except Exception as e:  # any error is the finding; its first line names the key
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    finally:
        root.removeHandler(warnings)
    return f"warns (use the new spelling): {' | '.join(warnings.lines)}" if warnings.lines else None


def problem(command: str, stand_ins: dict[str, str]) -> str | None:
    """None when one job of `command` and each other value of its sweeps compose and type without a warning
    (every preset and value it names, without the sweep's product); else what went wrong."""
    try:
        job = parse(command, stand_ins)
        if job.config_name != "config":
            return f"-cn {job.config_name}: conf/ has one primary config, config.yaml"
        if sweeps_without_multirun(job):
            return "a sweep without -m: Hydra stops with 'Ambiguous value for argument'"
    except Exception as e:
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    first, problems = job.first(), [job_problem(job.first())]
    for i, value in job.other_values():
        override = parser.parse_override(value)
        if is_plain_key(override):  # a key's value: set it on the first job's config
            problems.append(job_problem(first, override))
        else:  # a preset, an added or deleted key: compose anew
            problems.append(job_problem((*first[:i], value, *first[i + 1 :])))
    return "; ".join(dict.fromkeys(p for p in problems if p)) or None


def is_plain_key(override: Override) -> bool:
    """A dotted key of the job's config that the override changes (not a group, added, deleted or Hydra's)."""
    key = override.key_or_group
    return override.get_key_element() == key and "." in key and not key.startswith("hydra.")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each missing file of WRITTEN_BY_AN_EARLIER_STEP -> the path of its stand-in."""
    folder, paths = tmp_path_factory.mktemp("written_earlier"), {}
    for i, (name, text) in enumerate(WRITTEN_BY_AN_EARLIER_STEP.items()):
        if not (ROOT / name).exists():
            paths[name] = str(folder / f"{i}_{Path(name).name}")
            Path(paths[name]).write_text(text)
    return paths


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_run_py_command_of_the_doc_composes_and_types(
    doc: Path, stand_ins: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # where run.py starts: relative paths in the commands are read from here
    commands = commands_in(doc.read_text())
    skipped = [c for c in commands if PLACEHOLDER.search(c.text)]
    checked = [c for c in commands if c not in skipped]
    failures = [f"{c.where(doc)}: {p}" for c in checked if (p := problem(c.text, stand_ins))]
    print(
        f"{doc.relative_to(ROOT)}: {len(checked)} checked, {len(skipped)} skipped ($variable or placeholder)"
    )
    assert not failures, "\n".join(["doc commands that no longer run as written:", *failures])


def test_the_scan_finds_commands_as_a_shell_reads_them() -> None:
    text = """run `python run.py -m a=1,2
b=3` inline; and `python3 run.py x=1` then `python run.py`'s default.

```bash
python run.py -m c=1 \\
    d=2 && echo done   # a comment
python run.py e=1 # comment
echo `python run.py f=1`
```

    python run.py g=$X <dir> h=...
not python run.py.bak, nor mypython run.py
"""
    found = [(c.line, c.text) for c in commands_in(text)]
    assert found == [
        (1, "python run.py -m a=1,2 b=3"),
        (2, "python3 run.py x=1"),
        (2, "python run.py"),
        (5, "python run.py -m c=1 d=2"),
        (7, "python run.py e=1"),
        (8, "python run.py f=1"),
        (11, "python run.py g=$X <dir> h=..."),
    ]
    assert [bool(PLACEHOLDER.search(t)) for _, t in found] == [False] * 6 + [True]


def test_a_sweep_is_read_value_by_value() -> None:
    command = "python run.py -m --cfg job --info defaults model=qwen3_tiny,qwen3_0_6b x=range(2,4) ~y p=a,a"
    job = parse(command, {"a": "/tmp/b"})
    assert job.multirun and job.first() == ("model=qwen3_tiny", "x=2", "~y", "p=/tmp/b")
    assert job.other_values() == [(0, "model=qwen3_0_6b"), (1, "x=3")]
    assert parse("python run.py -cn other hydra/launcher=local_gpus", {}).config_name == "other"
    with pytest.raises(ValueError, match="--frobnicate: a flag this test does not know"):
        parse("python run.py --frobnicate", {})


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (
            "python run.py cache.cpu_kv_cache_gb=1",
            "cache.cpu_kv_cache_gb is deprecated; use cache.cpu_kv_cache_gib",
        ),
        ("python run.py cache.block_sizes=16", "cache.block_sizes"),
        ("python run.py -m model=qwen3_tiny,no_such_model", "model/no_such_model"),
        ("python run.py -m cache.block_size=16,3", "cache.block_size"),
        ("python run.py -m scheduler.batching=mixed,prefill_last", "prefill_last"),
        ("python run.py -m cache.block_size=16 cache.block_size=32,0", "cache.block_size"),
        ("python run.py -m hydra.sweeper.n_trial=8", "hydra.sweeper.n_trial"),
        ("python run.py -m hydra/launcher=no_such_launcher", "hydra/launcher/no_such_launcher"),
        ("python run.py cache.block_size=16,64", "a sweep without -m"),
        ("python run.py -cn other", "-cn other"),
    ],
)
def test_a_stale_command_is_a_failure_naming_the_key(command: str, named: str) -> None:
    assert named in str(problem(command, {}))


def test_a_preset_that_sets_multirun_needs_no_m() -> None:
    command = "python run.py hparams_search=throughput_slo cache.block_size=16,64 hydra.sweeper.n_trials=8"
    assert problem(command, {}) is None
