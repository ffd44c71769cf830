"""Scoring raw rows (the score and evaluate stages): features compiled to per-column SQL
expressions and made dense in the Python worker, vs the Spark ML vector pipeline and a dense
`array<float>` crossing to Python. Same model, same rows, same predictions (checked).

    .venv/bin/python -m bench.scoring_raw [--rows 1000000]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from bench.common import alternate, entry, record
from bench.inference import timed_rows_per_s
from bench.preprocess import CONFIG


def _bundle(input_dim: int):
    from sparkml_dist.inference.bundle import ModelBundle
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.models.weights import state_dict_to_bytes

    spec = ModelSpec("mlp", input_dim, 0.0, (64,))
    torch.manual_seed(0)
    return ModelBundle(spec=spec, weights=state_dict_to_bytes(build_model(spec).state_dict()))


def main(rows: int = 1_000_000, spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig, load_config
    from sparkml_dist.data.features import (
        build_feature_pipeline,
        feature_names,
        scoring_frame,
        to_feature_frame,
    )
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.data.ingest import ingest
    from sparkml_dist.inference.udf import score_features
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-scoring-raw"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        write_csv(adult_like(spark, rows, seed=3), f"{tmp}/csv", 8)
        cfg = load_config(CONFIG, [f"data.train_path={tmp}/csv", f"data.test_path={tmp}/csv"])
        with ingest(spark, f"{tmp}/csv", cfg.data, require_label=False) as raw:
            model = build_feature_pipeline(cfg.data, cfg.features).fit(raw.accepted.limit(50_000))
            bundle = _bundle(len(feature_names(model, raw.accepted)))

            def compiled():
                frame, layout = scoring_frame(model, raw.accepted, with_label=False)
                return score_features(frame, bundle, layout=layout)

            def vectors():
                return score_features(to_feature_frame(model, raw.accepted, with_label=False), bundle)

            same = (
                compiled()
                .orderBy("row_id")
                .limit(2000)
                .toPandas()
                .probability.equals(vectors().orderBy("row_id").limit(2000).toPandas().probability)
            )
            o, b = alternate(
                lambda: timed_rows_per_s(compiled, rows), lambda: timed_rows_per_s(vectors, rows)
            )
    out = [
        entry(
            "score_raw_compiled_vs_vectors",
            o,
            b,
            "rows/s",
            "higher",
            None,
            note=f"{rows:,} Adult-shaped rows (cached typed), MLP 116-64-1; same predictions: {same}",
        )
    ]
    record(out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    main(parser.parse_args().rows)
