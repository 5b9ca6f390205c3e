"""The prepared GPU check runs on a machine without a GPU and says that nothing was measured."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_AND_CUDA = ("--providers", "cpu,cuda", "--out")


def test_the_model_check_answers_right_on_the_cpu_and_marks_gpu_rows_not_measured(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu/check_models.py",
            "--small",
            "--runs",
            "1",
            "--batches",
            "1,4",
            *CPU_AND_CUDA,
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "CUDAExecutionProvider" in done.stdout.splitlines()[0]:
        pytest.skip("this ONNX Runtime has CUDA: check.sh measures it")
    assert done.returncode == 2, done.stderr
    assert "NOT MEASURED" in done.stderr and "cuda" in done.stderr
    rows = [
        line for line in done.stdout.splitlines() if line.startswith("| conv") or line.startswith("| encoder")
    ]
    assert len(rows) == 4 and all(row.endswith("| yes |") for row in rows)
    assert out.read_text().count('"provider": "cpu"') == 4


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be visible here")
def test_check_sh_says_no_gpu_is_visible(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "benchmarks/gpu/check.sh", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert "no NVIDIA GPU visible" in done.stdout


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be visible here")
def test_check_sh_dry_run_runs_every_step_on_the_cpu_and_marks_gpu_rows_not_measured(tmp_path: Path) -> None:
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "benchmarks/gpu/check.sh", "--dry-run", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "dry run: no NVIDIA GPU visible here" in done.stdout
    table = (tmp_path / "table.md").read_text()
    for step in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5."):
        assert step in table
    assert "INT8 calibration table written" in table  # the tool ran even though TensorRT is absent
    assert "| conv | cpu | 8 |" in table and "| encoder | cpu | 1 |" in table
    assert "| cpu, device pool on cpu OrtValues | DevicePooledBackend |" in table
    assert "| injected persistent fault | CPU (stand-in: no CUDA provider) | 5/5 | yes | yes |" in table
    # CUDA shared memory bound straight to the windows: taken for every lone request, no H2D copy
    assert "| CPU stand-in, NOT MEASURED | 100/100 | 1 D2H + 0 H2D / 1 D2H + 1 H2D |" in table
    assert table.count("NOT MEASURED") >= 3 and "| NO |" not in table and "WRONG" not in table
