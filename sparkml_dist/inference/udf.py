"""Spark scoring with mapInArrow: Arrow batches straight into torch, one model per worker process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import Accumulator
from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, IntegerType

from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.data.loader import feature_columns, stored_features
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.spark.kind import is_connect
from sparkml_dist.tasks.base import PREDICTION, PROBABILITY

__all__ = ["PREDICTION", "PROBABILITY", "score_features"]

DENSE_CHUNK_FLOATS = 1 << 22  # 16 MiB of float32 features per forward pass in a scoring worker
GPU_CHUNK_ROWS = 1 << 16  # rows per forward pass on a GPU (compact on the host, dense on the device)
_ARROW = {"double": pa.float64(), "integer": pa.int32()}
_SPARK: dict[str, DataType] = {
    "double": DoubleType(),
    "integer": IntegerType(),
    "array<float>": ArrayType(FloatType()),
}


def score_features(
    df: DataFrame,
    bundle: ModelBundle,
    threads_per_worker: int = 1,
    passthrough: tuple[str, ...] = ("row_id",),
    layout: FeatureLayout | None = None,
    cpu_seconds: Accumulator | None = None,
    device: str = "auto",
) -> DataFrame:
    """(passthrough..., features) -> (passthrough..., the task's prediction columns: probability
    and prediction; prediction, probability and probabilities; or prediction). With a `layout`,
    the features arrive as its per-feature columns (`scoring_frame`) and each Arrow batch is made
    dense in the worker, at most `DENSE_CHUNK_FLOATS` values at a time (a layout with a wide
    one-hot block would otherwise make a 10,000-row Arrow batch hundreds of MiB). `cpu_seconds`,
    an accumulator, adds up the Python workers' CPU time for their tasks (Arrow in and out and the
    model, torch's threads included): the Python side of scoring's energy estimate. `device`
    (score.device): each task runs the model on the GPU Spark assigned it, else GPU 0 where torch
    sees one (`auto`, `cuda`), or on the CPU (`cpu`, or `auto` without a GPU); one model per
    worker process per device, a GPU's batches made dense on it (`inference.device`)."""
    weights = _shipped(df.sparkSession, bundle.weights)
    key, spec, target = bundle.key, bundle.spec, bundle.target
    keep = [c for c in passthrough if c in df.columns]
    outputs = target.kind.output_columns(target)
    schema = df.select(*keep).schema
    for name, kind in outputs:
        schema = schema.add(name, _SPARK[kind], True)
    names = [*keep, *(name for name, _ in outputs)]

    def score_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import torch

        # torch: imported on the executors, where the batches are scored
        from sparkml_dist.inference.device import scoring_device
        from sparkml_dist.inference.predict import MODEL_CACHE, predict

        on = scoring_device(device)
        # a GPU takes compact rows and makes them dense itself: its chunks are sized to fill it
        chunk_rows = (
            GPU_CHUNK_ROWS
            if on.type == "cuda"
            else max(1, DENSE_CHUNK_FLOATS // layout.dim)
            if layout is not None
            else 65536
        )

        # the worker process serves one task at a time: its CPU time across the task is the task's
        cpu0 = time.process_time()
        torch.set_num_threads(threads_per_worker)
        model = MODEL_CACHE.get(key, spec, lambda: weights.value, on)
        try:
            for batch in batches:
                columns = predict(
                    model,
                    target,
                    stored_features(batch, layout, where="a scoring batch"),
                    chunk_rows,
                    layout=layout,
                )
                arrays = [batch.column(c) for c in keep]
                arrays += [_arrow(columns[name], kind) for name, kind in outputs]
                yield pa.RecordBatch.from_arrays(arrays, names=names)
        finally:
            if cpu_seconds is not None:
                cpu_seconds.add(time.process_time() - cpu0)

    return df.select(*keep, *feature_columns(layout)).mapInArrow(score_batches, schema)


@dataclass(frozen=True)
class _InClosure:
    """The weights pickled with the scoring function itself, as a broadcast's `.value`."""

    value: bytes


def _shipped(spark, weights: bytes):
    """The model's weights as the executors get them: a broadcast (fetched once per executor),
    or on Spark Connect, which has none, inside the function Spark ships with each task."""
    if is_connect(spark):
        return _InClosure(weights)
    return spark.sparkContext.broadcast(weights)


def _arrow(values: np.ndarray, kind: str) -> pa.Array:
    if kind in _ARROW:
        return pa.array(values, _ARROW[kind])
    rows, width = values.shape  # array<float>: one list of `width` values per row, without a Python loop
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), pa.float32()))
