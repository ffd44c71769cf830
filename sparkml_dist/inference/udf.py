"""Spark scoring with mapInArrow: Arrow batches straight into torch, one model per worker process."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.data.loader import feature_columns
from sparkml_dist.inference.bundle import ModelBundle

PROBABILITY = "probability"
PREDICTION = "prediction"


def score_features(df: DataFrame, bundle: ModelBundle, threads_per_worker: int = 1,
                   threshold: float = 0.5, passthrough: tuple[str, ...] = ("row_id",),
                   layout: FeatureLayout | None = None) -> DataFrame:
    """(passthrough..., features array<float>) -> (passthrough..., probability, prediction).
    With a `layout`, the features arrive as its per-feature columns (`scoring_frame`) and each
    Arrow batch is made dense in the worker."""
    spark = df.sparkSession
    weights = spark.sparkContext.broadcast(bundle.weights)
    key, spec = bundle.key, bundle.spec
    keep = [c for c in passthrough if c in df.columns]
    schema = df.select(*keep).schema.add(PROBABILITY, "double", True).add(PREDICTION, "integer", True)
    names = [*keep, PROBABILITY, PREDICTION]

    def score_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import torch

        from sparkml_dist.data.loader import dense_features
        from sparkml_dist.inference.predict import MODEL_CACHE, predict_proba

        torch.set_num_threads(threads_per_worker)
        model = MODEL_CACHE.get(key, spec, lambda: weights.value)
        for batch in batches:
            proba = predict_proba(model, dense_features(batch, layout, where="a scoring batch"))
            arrays = [batch.column(c) for c in keep]
            arrays += [pa.array(proba, pa.float64()), pa.array((proba >= threshold).astype(np.int32), pa.int32())]
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return df.select(*keep, *feature_columns(layout)).mapInArrow(score_batches, schema)
