"""Every training method honours every task: one epoch of each method on a binary, a multiclass
and a regression target (real Adult rows: income, relationship with 6 classes, hours worked per
week), then evaluated through the Spark UDF with the task's own metrics."""

from __future__ import annotations

import math

import pytest
from stores import fresh_store

from sparkml_dist.config import parse_config
from sparkml_dist.config.loader import load_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TASKS = {
    "binary": {"label": {"column": "income", "positive": ">50K", "negative": "<=50K", "strip_suffix": "."}},
    "multiclass": {"label": {"column": "relationship"}, "income_role": "categorical"},
    "regression": {"label": {"column": "hours_per_week", "task": "regression"}, "income_role": "categorical"},
}
METHODS = {
    "ddp": [],
    "horovod": ["train.backend=horovod"],
    "fsdp": ["train.strategy=fsdp"],
    "tensor": ["train.strategy=tensor", "model.kind=transformer"],
    "pipeline": ["train.strategy=pipeline", "model.kind=transformer"],
    "hybrid": ["train.strategy=hybrid", "model.kind=transformer", "train.num_ranks=4"],
    "async": ["train.strategy=async", "train.num_ranks=3"],
    "federated": ["train.strategy=federated", "federated.client_column=workclass", "federated.rounds=1"],
}


def task_config(root, adult_config_path, task: str, *overrides: str):
    """The Adult config with another column as the label (the income column becomes a feature)."""
    import yaml

    from sparkml_dist.config.overrides import apply_overrides

    raw = yaml.safe_load(adult_config_path.read_text())
    spec = TASKS[task]
    label = spec["label"]["column"]
    for column in raw["data"]["columns"]:
        if column["name"] == "income":
            column["role"] = spec.get("income_role", "label")
        if column["name"] == label:
            column["role"] = "label"
    raw["data"]["label"] = spec["label"]
    raw["data"]["train_path"] = str(root / "adult_4k.csv")
    raw["tracking"]["gate"] = {}  # the task's default gate
    raw["tracking"]["registered_model"] = f"adult_{task}"
    return parse_config(
        apply_overrides(
            raw,
            [
                f"output.root={root / task}",
                f"tracking.tracking_uri={fresh_store(root)}",
                "train.epochs=1",
                *overrides,
            ],
        )
    )


@pytest.fixture(scope="module")
def prepared(spark, tmp_path_factory, adult_config_path):
    """The first 4,000 Adult training rows, preprocessed once per task."""
    from sparkml_dist.data.sources import resolve_path
    from sparkml_dist.stages import preprocess

    root = tmp_path_factory.mktemp("task_methods")
    source = resolve_path(load_config(adult_config_path).data.train_path)
    with open(source) as fh:
        (root / "adult_4k.csv").write_text("".join(next(fh) for _ in range(4000)))
    return root, {task: preprocess(spark, task_config(root, adult_config_path, task)) for task in TASKS}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("task", list(TASKS))
def test_one_epoch_of_every_method_on_every_task(spark, prepared, adult_config_path, task, method):
    from sparkml_dist.stages import evaluate, train
    from sparkml_dist.tasks import get_task
    from sparkml_dist.tracking.client import tracked_run

    root, preps = prepared
    cfg = task_config(root, adult_config_path, task, *METHODS[method])
    with tracked_run(cfg.tracking, f"{task}-{method}", cfg.flat_params()) as run:
        trained = train(spark, cfg, preps[task], run)
    target = trained.outcome.model.target
    assert target.task == task
    if task == "multiclass":
        assert len(target.classes) == 6 and trained.outcome.model.spec.output_dim == 6
    record = trained.records[-1]
    assert record.evaluation.metric == get_task(task).held_out_metric and math.isfinite(
        record.evaluation.value
    )
    report = evaluate(spark, cfg, trained.model_uri, cfg.tracking.tracking_uri)
    assert set(get_task(task).metrics) <= set(report.metrics), (
        "the task's metrics, from the Spark UDF's outputs"
    )
    assert report.metrics["rows"] > 10_000 and all(math.isfinite(v) for v in report.metrics.values())
    if task == "regression":
        # in the label's units: a standardised output read as hours would give r2 near -10
        assert report.metrics["r2"] > -0.1, report.metrics
    else:
        assert report.metrics["accuracy"] > 0.4


@pytest.mark.parametrize("task", ["multiclass", "regression"])
def test_finetune_and_contribute_honour_the_task(spark, prepared, adult_config_path, tmp_path, task):
    """After a champion of the task: fine-tuning on a subset keeps its classes or label scale, and
    a contribution is judged on the task's gate metric in its own direction (rmse: lower)."""
    import torch

    from sparkml_dist.community.deltas import save_delta
    from sparkml_dist.models.weights import state_dict_from_bytes
    from sparkml_dist.pipeline import run_pipeline
    from sparkml_dist.stages.contribute import contribute, write_delta
    from sparkml_dist.stages.finetune import finetune
    from sparkml_dist.tasks import get_task
    from sparkml_dist.tracking.client import tracked_run
    from sparkml_dist.tracking.models import load_bundle

    root, _ = prepared
    name = f"stages_{task}"
    cfg = task_config(
        root,
        adult_config_path,
        task,
        f"output.root={tmp_path}",
        "train.epochs=2",
        f"tracking.registered_model={name}",
        "tracking.gate.min_value=-1000",  # any model: champion
        "finetune.where=sex = 'Female'",
        "finetune.epochs=1",
        "finetune.max_original_drop=1000",
        "community.max_regression=0.0",
    )
    base = run_pipeline(spark, cfg)
    assert base.alias == "champion" and base.task == task
    with tracked_run(cfg.tracking, "finetune", cfg.flat_params()) as run:
        tuned = finetune(spark, cfg, run)
    metric = get_task(task).default_gate[0]
    assert tuned.alias == "finetuned" and metric in tuned.reason
    assert set(get_task(task).metrics) <= set(tuned.metrics["subset"])
    uri = cfg.tracking.tracking_uri
    before, after = load_bundle(f"models:/{name}/{base.version}", uri), load_bundle(tuned.model_uri, uri)
    assert after.target == before.target, "the fine-tuned model predicts the same classes, on the same scale"

    weights = state_dict_from_bytes(before.weights)
    last = [k for k in weights if k.endswith("weight")][-1]
    flip = save_delta(
        {k: (-2 * v if k == last else torch.zeros_like(v)) for k, v in weights.items()}, tmp_path / "flip.pt"
    )
    with tracked_run(cfg.tracking, "contribute", cfg.flat_params()) as run:
        verdict = contribute(spark, cfg, run, str(flip), "eve")
    assert not verdict.accepted and f"regression on held-out rows: {metric}" in verdict.reason, verdict.reason
    if task == "regression":  # mirrored predictions: r2 falls
        assert verdict.metric_after < verdict.metric_before
    honest = write_delta(f"models:/{name}/{base.version}", tuned.model_uri, uri, tmp_path / "honest.pt")
    relaxed = cfg.model_copy(
        update={"community": cfg.community.model_copy(update={"max_regression": 1000.0})}
    )
    with tracked_run(relaxed.tracking, "contribute", relaxed.flat_params()) as run:
        accepted = contribute(spark, relaxed, run, str(honest), "alice")
    assert accepted.accepted, accepted.reason
