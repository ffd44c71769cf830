"""The whole pipeline on the real UCI Adult data: real Spark, real DDP ranks, real MLflow (sqlite)."""

import json

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from sparkml_dist.pipeline import run_pipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def assert_the_run_says_what_it_cost(spark, client, run, summary):
    """Per rank, read back from MLflow: system metrics under MLflow's names, the step breakdown
    adding up to the measured step, energy with its method; the stages' Spark jobs in their groups."""
    metrics = run.data.metrics
    for rank in (0, 1):
        for name in (
            "cpu_utilization_percentage",
            "process_cpu_percentage",
            "process_rss_megabytes",
            "network_receive_megabytes",
        ):
            assert len(client.get_metric_history(summary.run_id, f"system/rank{rank}/{name}")) >= 8, (
                "one per epoch at least"
            )
        parts = [metrics[f"step_{part}_ms_rank{rank}"] for part in ("data", "compute", "comm", "optimizer")]
        assert sum(parts) == pytest.approx(metrics[f"step_total_ms_rank{rank}"], rel=0.1)
        assert metrics[f"step_comm_ms_rank{rank}"] > 0, "two ranks: gradients were allreduced, and timed"
        assert metrics[f"energy_joules_rank{rank}"] > 0
    assert run.data.tags["energy.method"] in {"estimate", "rapl"}
    assert metrics["energy_joules_total"] == pytest.approx(
        sum(
            m.value
            for r in (0, 1)
            for m in client.get_metric_history(summary.run_id, f"energy_joules_rank{r}")
        )
    )
    assert metrics["score_joules_per_million_rows"] > 0
    assert summary.energy.startswith("training ") and " J per training sample" in summary.energy
    assert "rank0" in summary.step_time and "comm" in summary.step_time
    tracker = spark.sparkContext.statusTracker()
    for stage in ("preprocess", "train", "evaluate", "score"):
        assert tracker.getJobIdsForGroup(f"sparkml_dist:{stage}"), (
            f"the {stage} stage's jobs are in its group"
        )
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    descriptions = [jobs.apply(i).description() for i in range(jobs.size())]
    described = {d.get() for d in descriptions if d.isDefined()}
    assert "train ddp: 8 epochs: 2 ranks (torch), attempt 1/3" in described, (
        "the Spark UI says what the barrier job is"
    )


def test_adult_pipeline_end_to_end_then_gate_keeps_the_champion(spark, make_adult_config, tmp_path):
    cfg = make_adult_config()
    summary = run_pipeline(spark, cfg)

    # accuracy bar from the dataset's own notes (C4.5 84.46%)
    assert summary.test_metrics["accuracy"] >= 0.84
    assert summary.test_metrics["roc_auc"] >= 0.88
    assert summary.rows["input"] == {"train": 32561, "test": 16282}
    assert summary.rows["rejected"] == {"train": 0, "test": 1}
    assert summary.rows["trained"] + summary.rows["validation"] == 32561
    # scoring conserves rows: every scorable input row has exactly one prediction
    assert summary.rows["scored"] + summary.rows["score_rejected"] == 16282
    predictions = pq.read_table(summary.outputs["predictions"]).to_pandas()
    assert len(predictions) == summary.rows["scored"] == 16281
    assert predictions["row_id"].is_unique
    assert set(predictions["predicted_label"]) == {">50K", "<=50K"}
    assert predictions["probability"].between(0, 1).all()

    client = MlflowClient(cfg.tracking.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.data.params["train.epochs"] == "8" and run.data.params["train.num_ranks"] == "2"
    assert run.data.metrics["test_accuracy"] == pytest.approx(summary.test_metrics["accuracy"])
    assert "samples_per_s_rank0" in run.data.metrics and "samples_per_s_rank1" in run.data.metrics
    assert len(client.get_metric_history(summary.run_id, "val_accuracy")) == 8
    # the epochs' ROC AUC, binned on each rank and summed: the validation rows rank as the test rows do
    val_auc = [m.value for m in client.get_metric_history(summary.run_id, "val_roc_auc")]
    assert len(val_auc) == 8 and val_auc[-1] == pytest.approx(summary.test_metrics["roc_auc"], abs=0.03)
    artifacts = {a.path for a in client.list_artifacts(summary.run_id, "plots")}
    assert artifacts == {
        "plots/loss_curves.png",
        "plots/roc.png",
        "plots/confusion_matrix.png",
        "plots/step_breakdown.png",
        "plots/system_metrics.png",
    }
    model_files = {a.path for a in client.list_artifacts(summary.run_id, "model/artifacts")}
    assert "model/artifacts/feature_pipeline" in model_files, "the feature pipeline travels with the model"
    assert summary.alias == "champion"
    assert (
        str(client.get_model_version_by_alias(cfg.tracking.registered_model, "champion").version)
        == summary.version
    )
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["run_id"] == summary.run_id
    assert_the_run_says_what_it_cost(spark, client, run, summary)

    # a second run that cannot pass the gate registers a challenger; the champion stays
    strict = make_adult_config("tracking.gate.min_value=0.99", "train.epochs=1")
    second = run_pipeline(spark, strict)
    assert second.alias == "challenger"
    assert "below the gate's minimum" in second.gate_reason
    assert (
        str(client.get_model_version_by_alias(cfg.tracking.registered_model, "champion").version)
        == summary.version
    )
    assert (
        str(client.get_model_version_by_alias(cfg.tracking.registered_model, "challenger").version)
        == second.version
    )
    assert client.get_run(second.run_id).data.tags["registry.reason"] == second.gate_reason
    # scoring always uses the champion, so the predictions still come from the first model
    again = pq.read_table(second.outputs["predictions"]).to_pandas().sort_values("row_id")
    assert again["probability"].to_numpy() == pytest.approx(
        predictions.sort_values("row_id")["probability"].to_numpy()
    )


def test_a_stage_that_fails_is_logged_as_failed_not_finished(spark, make_adult_config, caplog):
    """The stage's last log line is what a scheduler's log search or a person reads: a stage that
    raised says it failed. (Adult's test file has one reject, its banner line; a reject fraction
    of 1e-5 refuses it, so preprocess stops.)"""
    from sparkml_dist.errors import DataError

    cfg = make_adult_config("data.max_reject_fraction=0.00001")
    with (
        caplog.at_level("INFO", logger="sparkml_dist.pipeline"),
        pytest.raises(DataError, match="^data.test_path: "),
    ):
        run_pipeline(spark, cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkml_dist.pipeline"]
    assert lines[0] == "stage preprocess: started"
    assert lines[1].startswith("stage preprocess: failed after ") and len(lines) == 2, lines
    assert not any("finished" in line for line in lines)
