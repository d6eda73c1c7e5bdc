"""bench/gpu_check.py, the trainer's GPU check, runs its whole code path on the CPU at a tiny shape: the real
PolicyTrainer under torchrun with one FSDP2 rank, the report's rows, and the seeded model's log-probs compared across
precisions (on a GPU machine also across devices)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_the_trainer_at_a_tiny_shape_and_compares_logprobs(tmp_path):
    out = tmp_path / "gpu.txt"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--shapes", "tiny", "--steps", "1", "--batch", "2", "--prompt", "48",
         "--completion", "16", "--workdir", str(tmp_path), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    row = next(line for line in report.splitlines() if line.startswith("tiny "))
    assert "failed" not in row and "skipped" not in row, row
    tokens, step_s, tokens_per_s = row.split()[3:6]
    assert int(tokens) == 2 * (48 + 16)  # one epoch over the batch (the trainer's default)
    assert float(step_s) > 0 and float(tokens_per_s) > 0
    assert re.search(r"\d+\.\d GB", row), "the table's prediction is printed beside the measurement"
    agreement = next(line for line in report.splitlines() if line.startswith("cpu, bfloat16"))
    mean, largest = (float(x) for x in re.findall(r"\|diff\| ([0-9.e+-]+)", agreement))
    assert 0 <= mean <= largest < 0.5, agreement  # same weights, same code: only rounding differs
    assert "cuda: not available here" in report or "cuda, bfloat16" in report


def hiding(folder: Path, *packages: str) -> dict[str, str]:
    """An environment whose Pythons (this one and every child it starts) cannot import `packages`: a sitecustomize
    on PYTHONPATH marks them absent, as on a bare CUDA machine that has only torch, transformers and peft."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in packages))
    return {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}


def test_gpu_check_measures_without_pydantic_and_writes_each_row(tmp_path):
    out = tmp_path / "gpu.txt"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--shapes", "tiny", "--steps", "1", "--batch", "2", "--prompt", "32",
         "--completion", "8", "--no-without-checkpointing", "--workdir", str(tmp_path), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=hiding(tmp_path / "bare", "pydantic", "pydantic_core", "pydantic_settings"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "no pydantic here" in report
    row = next(line for line in report.splitlines() if line.startswith("tiny "))
    assert "failed" not in row, row
    assert int(row.split()[3]) == 2 * (32 + 8)
    assert "reference: cpu float32" in report


def test_gpu_check_says_which_imports_are_missing_in_its_report(tmp_path):
    out = tmp_path / "gpu.txt"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--shapes", "tiny", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=hiding(tmp_path / "bare", "openrlhf"))
    assert done.returncode == 1, done.stderr[-3000:]  # nothing could be measured
    assert re.search(r"failed: missing imports: openrlhf \((ModuleNotFound|Import)Error", out.read_text())
    assert "--carry" in out.read_text()  # and how to bring it
