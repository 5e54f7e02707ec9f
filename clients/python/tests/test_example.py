"""The notebook-style example of examples/python runs end to end against its own cluster."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "load_and_summarise.py"


def test_load_and_summarise_example_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rows", "20000"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loaded 20000 readings" in result.stdout
    assert "summary matches the source data" in result.stdout


def test_example_runs_against_a_given_cluster(cluster, tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rows", "3000", "--cluster-dir", str(cluster.dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "summary matches the source data" in result.stdout
