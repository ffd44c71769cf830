"""`train.input: dataframe`: the preprocess output dealt to the ranks by the barrier stage itself
(no rank reads training rows from storage) learns what the Parquet path learns."""

from __future__ import annotations

import pytest

from sparkml_dist.errors import ConfigError
from sparkml_dist.stages import evaluate, train
from sparkml_dist.tracking.client import tracked_run

pytestmark = [pytest.mark.spark]


def _test_accuracy(spark, cfg, prep) -> tuple[float, object]:
    with tracked_run(cfg.tracking, "train", {}) as run:
        result = train(spark, cfg, prep, run)
    report = evaluate(spark, cfg, result.model_uri, cfg.tracking.tracking_uri)
    return report.metrics["accuracy"], result


def test_dataframe_fed_training_matches_the_parquet_path(spark, adult_prep, make_adult_config):
    _, prep = adult_prep
    parquet, _ = _test_accuracy(spark, make_adult_config("train.epochs=3"), prep)
    dataframe, result = _test_accuracy(
        spark, make_adult_config("train.epochs=3", "train.input=dataframe"), prep
    )
    assert abs(dataframe - parquet) <= 0.005, (dataframe, parquet)
    assert dataframe >= 0.84
    rows = [r.samples for r in result.outcome.ranks]
    assert sum(rows) == prep.manifest.splits["train"].rows  # every training row dealt to exactly one rank
    assert max(rows) - min(rows) <= 4 and result.outcome.ranks_in_step


def test_dataframe_input_is_refused_where_ranks_share_rows(make_adult_config):
    with pytest.raises(ConfigError, match="train.input=dataframe deals each rank its own rows"):
        make_adult_config("train.input=dataframe", "train.strategy=tensor", "model.kind=transformer")
