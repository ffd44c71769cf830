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
    out = subprocess.run([sys.executable, "scripts/sync_notebooks.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    nb = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    assert [c["cell_type"] for c in nb["cells"]].count("code") >= 5


@pytest.mark.slow
def test_quickstart_notebook_runs_against_local_spark(tmp_path):
    env = {**os.environ, "SPARKML_DIST_OUTPUT": str(tmp_path / "out"), "SPARKML_DIST_EPOCHS": "4",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    out = subprocess.run([sys.executable, "notebooks/quickstart.py"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ranks ended with identical parameters: True" in out.stdout
    summary = json.loads((tmp_path / "out" / "notebook_summary.json").read_text())
    assert summary["test_metrics"]["accuracy"] >= 0.84
    assert summary["scored_rows"] + summary["rejected_rows"] == 16282
    assert "-> champion" in summary["registered"]
