"""Scoring throughput: our mapInArrow UDF vs the Arrow transfer ceiling (the same input read and
the same columns written, no model), vs mlflow.pyfunc.spark_udf (the model logged the way a
spark_udf user logs it, and as this project logs it), and (compute-bound model) vs plain
single-process torch.

    .venv/bin/python -m bench.inference [--rows 1000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from bench.common import alternate, entry, record

DIM = 32
# rounds of the 1M-row rows: a second each, and a single slow round moves a three-round median; each
# row also runs both sides once first, unrecorded (`alternate(warm_up=True)`)
ROUNDS = 5


def make_frame(spark, rows: int):
    from pyspark.sql import functions as F

    feats = F.array(*[F.rand(seed=i).cast("float") for i in range(DIM)]).alias("features")
    df = (
        spark.range(rows)
        .select(F.col("id").alias("row_id"), feats)
        .repartition(spark.sparkContext.defaultParallelism)
    )
    df = df.cache()
    df.count()
    return df


def bundle_for(hidden: list[int], target=None):
    """An MLP over DIM features with random weights, for `target` (default: binary)."""
    from sparkml_dist.inference.bundle import ModelBundle
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.models.weights import state_dict_to_bytes
    from sparkml_dist.tasks.base import Target

    target = target or Target("binary", ("0", "1"))
    outputs = len(target.classes) if target.task == "multiclass" else 1
    spec = ModelSpec("mlp", DIM, 0.0, tuple(hidden), output_dim=outputs)
    torch.manual_seed(0)
    return ModelBundle(spec=spec, weights=state_dict_to_bytes(build_model(spec).state_dict()), target=target)


def task_rows(df, rows: int) -> list[dict]:
    """Scoring rows/s of each task's outputs against the binary model's, on the same rows: a
    10-class model also returns the 10 probabilities (an array column), a regressor one value."""
    from sparkml_dist.inference.udf import score_features
    from sparkml_dist.tasks.base import Target

    binary = bundle_for([64])
    tasks = {
        "infer_multiclass10_vs_binary": Target("multiclass", tuple(str(d) for d in range(10))),
        "infer_regression_vs_binary": Target("regression", mean=40.0, std=12.0),
    }
    out = []
    for name, target in tasks.items():
        bundle = bundle_for([64], target)
        o, b = alternate(
            lambda: timed_rows_per_s(lambda: score_features(df, bundle), rows),
            lambda: timed_rows_per_s(lambda: score_features(df, binary), rows),
            rounds=ROUNDS,
            warm_up=True,
        )
        out.append(entry(name, o, b, "rows/s", "higher", 0.9, note=f"MLP {DIM}-64-k, {rows:,} rows"))
    return out


def timed_rows_per_s(df_fn, rows: int) -> float:
    t0 = time.perf_counter()
    df_fn().write.format("noop").mode("overwrite").save()
    return rows / (time.perf_counter() - t0)


def arrow_ceiling(df, bundle):
    """What `score_features` does without the model: every Arrow batch's features read into the
    same float32 matrix, and the same output columns (row_id, probability, prediction) written
    back, filled with zeros. The cost of moving the rows JVM -> Python -> JVM, and no more."""
    import pyarrow as pa

    from sparkml_dist.data.loader import dense_features
    from sparkml_dist.inference.udf import _SPARK, _arrow

    target = bundle.target
    outputs = target.kind.output_columns(target)
    schema = df.select("row_id").schema
    for name, kind in outputs:
        schema = schema.add(name, _SPARK[kind], True)

    def moved(batches):
        for batch in batches:
            x = dense_features(batch, None, where="a ceiling batch")
            zeros = [
                _arrow(np.zeros(len(x), np.float64 if kind == "double" else np.int32), kind)
                for _, kind in outputs
            ]
            yield pa.RecordBatch.from_arrays([batch.column("row_id"), *zeros], names=schema.names)

    return df.select("row_id", "features").mapInArrow(moved, schema)


def mlflow_udf_frame(spark, df, bundle, tmp: str):
    """The model as this project logs it (our pyfunc, signature `features: Array(float)`)."""
    import mlflow.pyfunc

    from sparkml_dist.tracking.models import save_pyfunc_model

    path = save_pyfunc_model(tmp, bundle.weights, bundle.spec, None)
    udf = mlflow.pyfunc.spark_udf(spark, model_uri=path, result_type="double", env_manager="local")
    return lambda: df.select("row_id", udf("features").alias("probability"))


def columns_frame(df):
    """The same rows with one float column per feature, as a user's table holds them (cached)."""
    from pyspark.sql import functions as F

    wide = df.select("row_id", *[F.col("features")[i].alias(f"f{i}") for i in range(DIM)]).cache()
    wide.count()
    return wide


def mlflow_columns_udf_frame(spark, wide, bundle, tmp: str):
    """The baseline as a user would set it up for `spark_udf`: the torch model (with its sigmoid)
    saved by `mlflow.pytorch` (pickle format) with a column-based signature inferred from a pandas
    sample, scored over the feature columns."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.models import infer_signature

    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.weights import state_dict_from_bytes

    net = build_model(bundle.spec)
    net.load_state_dict(state_dict_from_bytes(bundle.weights))
    model = torch.nn.Sequential(net, torch.nn.Sigmoid()).eval()
    sample = wide.limit(100).toPandas().drop(columns="row_id")
    with torch.no_grad():
        out = model(torch.from_numpy(sample.to_numpy(np.float32))).numpy()
    path = f"{tmp}/torch_columns"
    # pickle: the format that takes a pandas frame of columns (pt2 traces one tensor input)
    mlflow.pytorch.save_model(
        model,
        path,
        signature=infer_signature(sample, out),
        pip_requirements=["torch"],
        serialization_format="pickle",
    )
    udf = mlflow.pyfunc.spark_udf(spark, model_uri=path, result_type="double", env_manager="local")
    return lambda: wide.select("row_id", udf(*[f"f{i}" for i in range(DIM)]).alias("probability"))


def plain_torch_rows_per_s(model, x: np.ndarray, threads: int, batch_rows: int = 10_000) -> float:
    """The model as a torch user scores an array: forward calls of `batch_rows` rows, under
    `inference_mode`, a sigmoid for the probability."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(x), batch_rows):
            torch.sigmoid(model(torch.from_numpy(x[start : start + batch_rows]))).numpy()
    return len(x) / (time.perf_counter() - t0)


def main(rows: int = 1_000_000, spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.inference.udf import score_features
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-inference"))
    spark.sparkContext.setLogLevel("ERROR")
    df = make_frame(spark, rows)
    small = bundle_for([64])
    rows_out = []
    ours_small = lambda: score_features(df, small)  # noqa: E731
    o, b = alternate(
        lambda: timed_rows_per_s(ours_small, rows),
        lambda: timed_rows_per_s(lambda: arrow_ceiling(df, small), rows),
        rounds=ROUNDS,
        warm_up=True,
    )
    rows_out.append(
        entry(
            "infer_vs_arrow_ceiling",
            o,
            b,
            "rows/s",
            "higher",
            0.95,
            note="ceiling: the same input read and the same three columns written, no model",
        )
    )
    wide = columns_frame(df)
    with tempfile.TemporaryDirectory() as tmp:
        columns_udf = mlflow_columns_udf_frame(spark, wide, small, tmp)
        o, b = alternate(
            lambda: timed_rows_per_s(ours_small, rows),
            lambda: timed_rows_per_s(columns_udf, rows),
            warm_up=True,
        )
        rows_out.append(
            entry(
                "infer_vs_mlflow_spark_udf",
                o,
                b,
                "rows/s",
                "higher",
                1.9,
                note=f"baseline: mlflow.pytorch model, column signature ({DIM} float columns)",
            )
        )
        array_udf = mlflow_udf_frame(spark, df, small, tmp)
        o, b = alternate(
            lambda: timed_rows_per_s(ours_small, rows),
            lambda: timed_rows_per_s(array_udf, rows),
            warm_up=True,
        )
        rows_out.append(
            entry(
                "infer_vs_mlflow_spark_udf_array_signature",
                o,
                b,
                "rows/s",
                "higher",
                None,
                note="baseline: this project's pyfunc, signature features: Array(float)",
            )
        )
    wide.unpersist()
    rows_out.append(predict_batch_udf_row(df, small, rows))
    rows_out.extend(task_rows(df, rows))

    rows_out.append(compute_bound_row(spark, df))
    df.unpersist()
    record(rows_out)
    return rows_out


def predict_batch_udf_row(df, bundle, rows: int) -> dict:
    """Ours against pyspark's `predict_batch_udf` set up as its docs show (bench.memory's
    `predict_batch_udf_frame`: the model built once per worker, batches of 1,024 rows), the same
    model over the same cached rows, each written to the noop sink."""
    from bench.memory import predict_batch_udf_frame
    from sparkml_dist.inference.udf import score_features

    o, b = alternate(
        lambda: timed_rows_per_s(lambda: score_features(df, bundle), rows),
        lambda: timed_rows_per_s(lambda: predict_batch_udf_frame(df, bundle), rows),
        rounds=ROUNDS,
        warm_up=True,
    )
    return entry(
        "infer_vs_predict_batch_udf",
        o,
        b,
        "rows/s",
        "higher",
        1.0,
        note=f"MLP {DIM}-64-1, {rows:,} rows; ours writes the probability and the prediction, "
        "predict_batch_udf(batch_size=1024) the probability",
    )


def compute_bound_row(spark, df) -> dict:
    """A model whose forward pass, not the data's way in, is the cost: ours inside Spark vs the
    same model in plain torch over the same rows in one process."""
    from sparkml_dist.inference.predict import MODEL_CACHE, forward_rows
    from sparkml_dist.inference.udf import score_features

    big = bundle_for([1024, 1024])
    cores = spark.sparkContext.defaultParallelism
    x = np.stack(df.limit(200_000).toPandas()["features"].to_numpy()).astype(np.float32)
    model = MODEL_CACHE.get(big.key, big.spec, lambda: big.weights)
    n = len(x)
    sub = df.limit(n).repartition(cores).cache()  # limit() leaves one partition: spread it over the cores
    sub.count()
    # the baseline's forward calls as large as ours (forward_rows: sized to the cache), so the
    # row compares running the model inside Spark, not two chunkings of it
    chunk = forward_rows(model, 10_000)
    o, b = alternate(
        lambda: timed_rows_per_s(lambda: score_features(sub, big), n),
        lambda: plain_torch_rows_per_s(model, x, cores, chunk),
        warm_up=True,  # the workers' first load of the model is not a round's
    )
    sub.unpersist()
    return entry(
        "infer_compute_bound_vs_torch",
        o,
        b,
        "rows/s",
        "higher",
        0.8,
        note=f"MLP 32-1024-1024-1 on {n:,} rows; torch with {cores} threads; both in forward calls of {chunk:,} rows",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--only",
        choices=["compute_bound", "predict_batch_udf"],
        help="one row alone: infer_compute_bound_vs_torch (200,000 rows) or infer_vs_predict_batch_udf",
    )
    args = parser.parse_args()
    if args.only:
        from sparkml_dist.config import SparkConfig
        from sparkml_dist.spark import build_session

        session = build_session(SparkConfig(master="local[2]", app_name="bench-inference"))
        session.sparkContext.setLogLevel("ERROR")
        if args.only == "compute_bound":
            record([compute_bound_row(session, make_frame(session, 200_000))])
        else:
            record([predict_batch_udf_row(make_frame(session, args.rows), bundle_for([64]), args.rows)])
    else:
        main(args.rows)
