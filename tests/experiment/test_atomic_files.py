"""Every results and report file is written whole or not at all: a disk that fills up part-way through
the sweep report leaves no half file and no temporary file, the failure reaches the sweep's exit code as
one line, and no write in the experiment layer bypasses the atomic writer."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nanoexp.experiment.report.sweep_report import write_report
from nanoexp.experiment.runtime import atomic_files

ROOT = Path(__file__).resolve().parents[2]
REPORT_FILES = (
    "sweep_summary.csv",
    "sweep_summary.md",
    "sweep_cache_block_size.png",
    "sweep_latency_cdf.png",
)


def fake_sweep(sweep: Path) -> None:
    for num, block_size in enumerate((16, 32, 64)):
        job_dir = sweep / f"{num}_cache.block_size={block_size}"
        (job_dir / ".hydra").mkdir(parents=True)
        overrides = [f"cache.block_size={block_size}"]
        (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        summary = {"output_throughput": 10.0 * (num + 1), "mean_ttft_ms": 5.0 + num, "model": "m"}
        job = {"job_num": num, "overrides": overrides}
        (job_dir / "results.json").write_text(json.dumps({"status": "ok", "job": job, "summary": summary}))
        rows = "repeat,request_id,output_len,ttft_ms,tpot_ms\n"
        rows += "".join(f"0,{i},4,{i + num},{1 + i}\n" for i in range(5))
        (job_dir / "requests.csv").write_text(rows)


class Budgeted:
    """A file on a disk with `left[0]` bytes free: the write that crosses it fails with ENOSPC after
    writing what fits, as a full disk does."""

    def __init__(self, f, left: list[int]) -> None:
        self.f, self.left = f, left

    def write(self, data):
        if len(data) > self.left[0]:
            self.f.write(data[: self.left[0]])
            self.left[0] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left[0] -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def disk_with(monkeypatch, free_bytes: int) -> None:
    opened, left = Path.open, [free_bytes]

    def open_budgeted(path, mode="r", *args, **kwargs):
        f = opened(path, mode, *args, **kwargs)
        return Budgeted(f, left) if "w" in mode else f

    monkeypatch.setattr(Path, "open", open_budgeted)


def test_a_disk_that_fills_during_the_report_leaves_only_whole_files(tmp_path: Path, monkeypatch) -> None:
    whole = tmp_path / "s999999999"  # report files name their dir: each dir's name has the same length
    fake_sweep(whole)
    write_report(whole)
    sizes = {name: (whole / name).stat().st_size for name in REPORT_FILES}
    budgets = [0, sizes["sweep_summary.csv"] // 2, sum(sizes.values()) - sizes["sweep_latency_cdf.png"] // 2]
    for free in budgets:
        sweep = tmp_path / f"s{free:09d}"
        fake_sweep(sweep)
        with monkeypatch.context() as m:
            disk_with(m, free)
            with pytest.raises(OSError, match="No space left"):
                write_report(sweep)
        assert not list(sweep.rglob("*.partial")), free
        written = [name for name in REPORT_FILES if (sweep / name).exists()]
        for name in written:  # each file there is the whole file
            assert (sweep / name).stat().st_size == sizes[name], (free, name)
        assert len(written) < len(REPORT_FILES)
    png = (whole / "sweep_latency_cdf.png").read_bytes()
    assert png.endswith(b"IEND\xaeB`\x82")


def test_a_failed_write_removes_its_temporary_file_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch
) -> None:
    target = tmp_path / "results.json"
    atomic_files.write_atomically(target, "old\n")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(OSError):
        atomic_files.write_atomically(target, "new\n")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


# A write that names its file, in the package, run.py and the studies' scripts: each must go through
# atomic_files.
DIRECT_WRITE = re.compile(
    r"\.savefig\(|\.to_csv\(|\.to_json\(|\.write_text\(|\.write_bytes\(|export_chrome_trace\(|json\.dump\("
    r"|torch\.save\(|np\.save|\.tofile\(|open\([^)]*[\"'][wax]b?\+?[\"']"
)
SCANNED = ("nanoexp", "experiments", "scripts", "run.py")
NOT_RESULTS = {  # (file, what it writes): files that are not results, written in place on purpose
    ("gpus.py", ".write_text("),  # a GPU lock file holding a pid
    ("gpus.py", 'open(lock_dir / f"{host}.mutex", "a")'),  # the lock's mutex file
    ("sweep_callback.py", '.open("a+")'),  # the sweep's lock file
    ("run_log.py", '.open("a")'),  # run.log, which Hydra's logging appends to as well
    ("peak_memory.py", "Path(CLEAR_REFS).write_text("),  # a /proc control file, not a file
    ("check_cost.py", 'open(path / "model.safetensors", "wb")'),  # the sparse checkpoint a timing loads
    ("flash_attn_lean_setup.py", ".write_text("),  # flash-attn's sources, patched before its build
    ("train_tiny.py", ".write_text("),  # the trained tiny model's prompts file, an input
    ("bench_all_reduce.py", "torch.save("),  # into the atomic_open handle of the line before
}


def test_every_results_and_report_write_goes_through_the_atomic_writer() -> None:
    offenders = []
    paths = [ROOT / p for p in SCANNED if p.endswith(".py")]
    paths += [f for p in SCANNED if not p.endswith(".py") for f in (ROOT / p).rglob("*.py")]
    for path in sorted(paths):
        if path.name == "atomic_files.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = DIRECT_WRITE.search(line)
            allowed = any(path.name == f and snippet in line for f, snippet in NOT_RESULTS)
            if match and not allowed and "atomic_files." not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.slow
def test_a_sweep_whose_report_cannot_be_written_exits_1_with_one_line(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "sweep_summary.md").mkdir(parents=True)  # the report's rename into place fails
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_FULL_ERROR"))}
    cmd = [sys.executable, "run.py", "-m", f"hydra.sweep.dir={sweep}", "model=qwen3_tiny", "logger=none"]
    cmd += [
        "cache.cpu_kv_cache_gib=0.05",
        "workload.num_requests=2",
        "workload.output_len=2",
        "workload.seed=0,1",
    ]
    cmd += ["metrics.kv_quality.num_requests=0"]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("nanoexp: error:")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "sweep report" in lines[0] and "sweep_summary.md" in lines[0]
    assert not list(sweep.rglob("*.partial"))


def test_compare_into_an_unwritable_dir_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    from nanoexp.experiment.report import compare

    fake_sweep(tmp_path / "a")
    fake_sweep(tmp_path / "b")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = compare.cli([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(blocker / "out")])
    err = capsys.readouterr().err.splitlines()
    where = blocker / "out"
    expected = f"nanoexp: error: cannot write '{where}': Not a directory (set --out to a writable directory)"
    assert code == 1 and err == [expected]
