"""Feature pipeline: fixed-width vectors, imputation, and unseen categories at scoring time."""

import pytest
from pyspark.sql import functions as F

from sparkml_dist.config import FeatureConfig
from sparkml_dist.data.features import build_feature_pipeline, feature_names, to_feature_frame
from sparkml_dist.data.ingest import ingest
from test_ingest import small_config

pytestmark = pytest.mark.spark


def test_features_have_fixed_width_and_survive_unseen_categories(spark, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("30, 1.0, Paris, yes\n40, 2.0, Rome, no\n?, 3.0, ?, no\n50, 4.0, Rome, yes\n")
    score = tmp_path / "score.csv"
    score.write_text("35, 2.5, Tokyo, yes\n")  # Tokyo never seen in training
    cfg = small_config(train)
    rows = ingest(spark, str(train), cfg).accepted
    model = build_feature_pipeline(cfg, FeatureConfig()).fit(rows)
    feats = to_feature_frame(model, rows).collect()
    # 2 scaled numerics + city one-hot over {Rome, Paris, __missing__} + 1 unseen slot
    assert {len(r["features"]) for r in feats} == {6}
    assert all(all(v == v for v in r["features"]) for r in feats), "no NaN after imputation"
    names = feature_names(model, rows)
    assert len(names) == 6 and any("city" in n for n in names)
    unseen = to_feature_frame(model, ingest(spark, str(score), cfg).accepted).collect()
    assert len(unseen) == 1 and len(unseen[0]["features"]) == 6
    assert unseen[0]["features"][-1] == 1.0, "the unseen category lands in the extra slot"


def test_scaled_numerics_are_standardised(spark, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("".join(f"{20 + i}, {i}.0, A, yes\n" for i in range(50)))
    cfg = small_config(train)
    rows = ingest(spark, str(train), cfg).accepted
    out = to_feature_frame(build_feature_pipeline(cfg, FeatureConfig()).fit(rows), rows)
    stats = out.select(F.avg(F.col("features")[0]).alias("m"), F.stddev(F.col("features")[0]).alias("s")).first()
    assert abs(stats["m"]) < 1e-5 and abs(stats["s"] - 1) < 1e-5
