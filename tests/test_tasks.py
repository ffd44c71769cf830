"""Multiclass and regression end to end, run exactly as the README shows them (its commands, in a
fresh working directory with the repository's conf/), on real data that registry wheels ship:
MNIST (10 classes, 70,000 images) and ggplot2's diamonds (regression, 53,940 rows). Each must
reach the published figure of a comparable model."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.linear_model import LinearRegression  # at collection: importing sklearn sets KMP_* variables
from sklearn.metrics import mean_squared_error, r2_score

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ".venv/bin/python -m sparkml_dist.data.examples mnist diamonds --out data"
MNIST = ".venv/bin/python -m sparkml_dist.cli pipeline --config conf/mnist.yaml"
DIAMONDS = ".venv/bin/python -m sparkml_dist.cli pipeline --config conf/diamonds.yaml"


def run_as_written(command: str, cwd: Path, timeout: int = 900) -> str:
    assert command in (ROOT / "README.md").read_text(), f"the README shows `{command}`"
    # a temp dir of its own: what another test running beside it downloads is not this job's
    tmp = Path(tempfile.mkdtemp(prefix="job-tmp-", dir=cwd))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKML_DIST_", "MLFLOW_TRACKING"))}
    env["TMPDIR"] = str(tmp)
    done = subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "Downloading artifacts" not in done.stderr, "a job's log carries no MLflow download progress bars"
    assert not list(tmp.glob("sparkml_dist_model*")), (
        "the models the job downloaded (evaluate, register, score) are gone when it ends"
    )
    return done.stdout


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory like a fresh clone's: conf/ and .venv/ from the repository, nothing else."""
    cwd = tmp_path_factory.mktemp("readme")
    for name in ("conf", ".venv"):
        (cwd / name).symlink_to(ROOT / name)
    out = run_as_written(EXAMPLES, cwd)
    assert (
        "mnist: train 60,000 rows, test 10,000 rows" in out
        and "diamonds: train 48,639 rows, test 5,301 rows" in out
    )
    return cwd


def summary_of(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "output" / name / "summary.json").read_text())


def test_mnist_digits_reach_the_published_mlp_error(workdir):
    out = run_as_written(MNIST, workdir)
    assert "task           : multiclass: 10 classes (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)" in out
    summary = summary_of(workdir, "mnist")
    metrics = summary["test_metrics"]
    # LeCun et al. 1998 (Proc. IEEE 86(11), table of MNIST results): a 3-layer net with 500+150
    # hidden units, 2.95% test error. This one has 256+128 hidden units.
    assert metrics["accuracy"] >= 1 - 0.0295, metrics
    assert metrics["macro_f1"] >= 0.96 and metrics["log_loss"] < 0.15
    assert summary["rows"]["input"] == {"train": 60000, "test": 10000} and summary["rows"]["scored"] == 10000
    assert summary["alias"] == "champion"

    predictions = pq.read_table(summary["outputs"]["predictions"]).to_pandas()
    assert len(predictions) == 10000
    assert set(predictions["predicted_label"]) == {str(d) for d in range(10)}, "the original label values"
    probabilities = np.stack(predictions["probabilities"].to_numpy())
    assert probabilities.shape == (10000, 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(probabilities.max(axis=1), predictions["probability"], atol=1e-6)
    plots = {p.name for p in Path(summary["outputs"]["plots"]).iterdir()}
    assert {"confusion_matrix.png", "loss_curves.png"} <= plots

    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    assert client.get_run(summary["run_id"]).data.tags["sparkml_dist.task"] == "multiclass"
    # each epoch's macro F1 from the ranks' summed confusion counts: the validation rows score as the test rows do
    val_f1 = [m.value for m in client.get_metric_history(summary["run_id"], "val_macro_f1")]
    assert val_f1 and val_f1[-1] == pytest.approx(metrics["macro_f1"], abs=0.02)
    table = json.loads(
        Path(client.download_artifacts(summary["run_id"], "metrics/per_class.json", str(workdir))).read_text()
    )
    assert len(table) == 10 and all(row["recall"] > 0.9 for row in table), table


def test_diamond_prices_beat_least_squares_on_the_same_columns(workdir):
    out = run_as_written(DIAMONDS, workdir)
    assert "task           : regression" in out
    summary = summary_of(workdir, "diamonds")
    metrics = summary["test_metrics"]
    # Ordinary least squares on the same columns (cut, color and clarity one-hot): R² 0.92 on
    # diamonds, the figure usually quoted for it; computed here on the same split.
    baseline = least_squares(workdir / "data" / "diamonds")
    assert baseline["r2"] > 0.9
    assert metrics["r2"] >= 0.95 and metrics["rmse"] < baseline["rmse"], (metrics, baseline)
    assert summary["rows"]["input"] == {"train": 48639, "test": 5301}

    predictions = pq.read_table(summary["outputs"]["predictions"]).to_pandas()
    test = __import__("pandas").read_csv(workdir / "data" / "diamonds" / "test.csv")
    joined = test.merge(predictions, on="id", validate="one_to_one")  # the id column passed through
    assert len(joined) == 5301
    assert np.sqrt(np.mean((joined["prediction"] - joined["price"]) ** 2)) == pytest.approx(
        metrics["rmse"], rel=1e-3
    )
    plots = {p.name for p in Path(summary["outputs"]["plots"]).iterdir()}
    assert {"predicted_vs_actual.png", "residuals.png"} <= plots

    from mlflow.tracking import MlflowClient

    # each epoch's r2 and mae from the ranks' summed errors: the validation rows score as the test rows do
    client = MlflowClient(summary["tracking_uri"])
    val_r2, val_mae = (
        [m.value for m in client.get_metric_history(summary["run_id"], name)]
        for name in ("val_r2", "val_mae")
    )
    assert len(val_r2) == len(val_mae) == 12 and val_r2[-1] == pytest.approx(metrics["r2"], abs=0.01)
    assert val_mae[-1] == pytest.approx(metrics["mae"], rel=0.1)


def least_squares(folder: Path) -> dict[str, float]:
    import pandas as pd

    train, test = (pd.read_csv(folder / f"{name}.csv") for name in ("train", "test"))
    both = pd.get_dummies(pd.concat([train, test]).drop(columns=["id", "price"]), dtype=float)
    x_train, x_test = both.iloc[: len(train)], both.iloc[len(train) :]
    predicted = LinearRegression().fit(x_train, train["price"]).predict(x_test)
    return {
        "r2": r2_score(test["price"], predicted),
        "rmse": mean_squared_error(test["price"], predicted) ** 0.5,
    }
