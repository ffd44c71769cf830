"""The quickstart notebook: its Jupyter copy is in step with the Databricks source, and the
source runs top to bottom against local Spark with real results."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_jupyter_notebook_is_in_step_with_the_databricks_source():
    out = subprocess.run(
        [sys.executable, "scripts/sync_notebooks.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout
    nb = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    assert [c["cell_type"] for c in nb["cells"]].count("code") >= 5


@pytest.mark.slow
def test_quickstart_notebook_runs_against_local_spark(tmp_path):
    env = {
        **os.environ,
        "SPARKML_DIST_OUTPUT": str(tmp_path / "out"),
        "SPARKML_DIST_EPOCHS": "4",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    out = subprocess.run(
        [sys.executable, "notebooks/quickstart.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ranks ended with identical parameters: True" in out.stdout
    summary = json.loads((tmp_path / "out" / "notebook_summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84
    assert summary["scored_rows"] + summary["rejected_rows"] == 16282
    assert "-> champion" in summary["registered"]


@pytest.mark.slow
def test_bring_your_own_notebook_as_the_readme_runs_it(tmp_path):
    command = ".venv/bin/python notebooks/bring_your_own.py"
    assert command in (ROOT / "README.md").read_text(), f"the README shows `{command}`"
    env = {
        **os.environ,
        "SPARKML_DIST_OUTPUT": str(tmp_path / "out"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    out = subprocess.run(command.split(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split(":")[0].strip(): line for line in out.stdout.splitlines() if ":" in line}
    ours = float(lines["sparkml_dist.TorchDistributor"].split("accuracy ")[1].split()[0])
    theirs = float(lines["pyspark TorchDistributor"].split("accuracy ")[1].split()[0])
    assert ours == theirs and ours > 0.95  # the same function learns the same thing under both
    assert float(lines["largest difference between the two runs' final weights"].split(": ")[1]) <= 1e-6
    assert "rank 1 (host 127.0.0.1) failed: FileNotFoundError: /data/shard-1.parquet" in out.stdout
    assert "[rank 0] rank 0 loading its shard" in out.stdout  # rank output streamed to the driver
    fed = lines["DataFrame-fed"]
    assert float(fed.split("accuracy ")[1].split(";")[0]) > 0.93  # 0.63 by always saying "benign"
    (rows0, steps0), (rows1, steps1) = json.loads(
        fed.split("per rank ")[1].replace("(", "[").replace(")", "]")
    )
    assert rows0 + rows1 == 569 and steps0 == steps1
    assert float(lines["pipeline with your network"].split("test accuracy ")[1].split(";")[0]) >= 0.84
    assert "as 'champion'" in out.stdout
