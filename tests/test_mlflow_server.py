"""The pipeline against a real `mlflow server` process (not the sqlite file store)."""

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from sparkml_dist.pipeline import run_pipeline
from sparkml_dist.services.mlflow_server import start_mlflow_server

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def mlflow_server(tmp_path):
    server = start_mlflow_server(tmp_path / "mlflow-server")
    yield server
    server.stop()
    assert server.process.poll() is not None, "the server is stopped by PID"


def test_pipeline_tracks_registers_and_scores_through_a_tracking_server(
    spark, make_adult_config, mlflow_server
):
    cfg = make_adult_config(f"tracking.tracking_uri={mlflow_server.url}", "train.epochs=4")
    summary = run_pipeline(spark, cfg)
    client = MlflowClient(tracking_uri=mlflow_server.url, registry_uri=mlflow_server.url)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_accuracy"] == pytest.approx(summary.test_metrics["accuracy"])
    assert run.data.metrics["test_accuracy"] >= 0.84
    assert len(client.get_metric_history(summary.run_id, "val_accuracy")) == 4
    champion = client.get_model_version_by_alias(cfg.tracking.registered_model, "champion")
    assert str(champion.version) == summary.version and champion.run_id == summary.run_id
    # batch scoring loaded models:/<name>@champion from the server's registry
    predictions = pq.read_table(summary.outputs["predictions"])
    assert predictions.num_rows == summary.rows["scored"] == 16281
