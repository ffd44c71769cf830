"""Spark ML itself on the same data and split: the user's most obvious alternative.

    .venv/bin/python -m bench.spark_ml [--rounds 2]

Adult (binary: income) and diamonds (regression: price), each from its raw CSV files to a metric
on the test file, end to end in one warm Spark session. Ours is the preprocess, train and
evaluate stages with the shipped config (conf/adult.yaml, conf/diamonds.yaml). Spark ML's models
are set up as a Spark ML user sets them up: the same typed read of the same files, a Pipeline of
StringIndexer, OneHotEncoder, Imputer (median), VectorAssembler and StandardScaler, the training
features cached, then LogisticRegression, GBTClassifier and MultilayerPerceptronClassifier (the
same hidden layers as ours) or LinearRegression and GBTRegressor, scored with Spark ML's own
evaluators. Ours and each model take turns within every round.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import Measured, entry, in_turn, record, scratch_dir

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    """One end-to-end run: its wall seconds and its test metric."""

    seconds: float
    metric: float


def our_run(spark, config: Path, overrides: list[str], metric: str) -> Run:
    from sparkml_dist.config import load_config
    from sparkml_dist.stages import evaluate, preprocess, train
    from sparkml_dist.tracking.client import tracked_run

    out = scratch_dir()
    cfg = load_config(
        config, [*overrides, f"output.root={out}", f"tracking.tracking_uri=sqlite:///{out}/mlflow.db"]
    )
    start = time.perf_counter()
    prepared = preprocess(spark, cfg)
    with tracked_run(cfg.tracking, "bench-spark-ml", cfg.flat_params()) as run:
        trained = train(spark, cfg, prepared, run)
    report = evaluate(spark, cfg, trained.model_uri, cfg.tracking.tracking_uri)
    return Run(time.perf_counter() - start, report.metrics[metric])


def typed_frames(spark, config: Path, overrides: list[str]):
    """(train, test, columns): the CSVs read with the config's own column types, and the label's
    trailing '.' (Adult's test file) stripped, as a Spark ML user would clean it."""
    from pyspark.sql import functions as F

    from sparkml_dist.config import load_config
    from sparkml_dist.storage.packages import resolve_path

    data = load_config(config, overrides).data
    ddl = ", ".join(f"`{c.name}` {c.type}" for c in data.columns)

    # Spark's reader takes one null marker; the config may list none or several
    first_null, *more_nulls = data.null_values or [""]
    texts = [c.name for c in data.columns if c.type == "string"]

    def read(path: str):
        frame = spark.read.csv(
            resolve_path(path),
            schema=ddl,
            header=data.header,
            nullValue=first_null,
            ignoreLeadingWhiteSpace=True,
            ignoreTrailingWhiteSpace=True,
        )
        if more_nulls:  # a number column already reads them as null (not a number)
            frame = frame.select(
                *(
                    F.when(F.col(c).isin(more_nulls), None).otherwise(F.col(c)).alias(c) if c in texts else c
                    for c in frame.columns
                )
            )
        label = data.label.column
        if data.label.strip_suffix:
            frame = frame.withColumn(
                label, F.regexp_replace(label, re.escape(data.label.strip_suffix) + "$", "")
            )
        return frame.where(F.col(label).isNotNull())  # a blank or a stray line has no label

    return read(data.train_path), read(data.test_path), data


def features_pipeline(data):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import Imputer, OneHotEncoder, StandardScaler, StringIndexer, VectorAssembler

    categorical = [c.name for c in data.columns if c.role == "categorical"]
    numeric = [c.name for c in data.columns if c.role == "numeric"]
    indexed, encoded, imputed = (
        [f"{c}_idx" for c in categorical],
        [f"{c}_ohe" for c in categorical],
        [f"{c}_imp" for c in numeric],
    )
    stages = [
        StringIndexer(inputCols=categorical, outputCols=indexed, handleInvalid="keep"),
        OneHotEncoder(inputCols=indexed, outputCols=encoded, handleInvalid="keep"),
        Imputer(inputCols=numeric, outputCols=imputed, strategy="median"),
        VectorAssembler(inputCols=encoded + imputed, outputCol="raw", handleInvalid="keep"),
        StandardScaler(inputCol="raw", outputCol="features"),
    ]
    if data.label.task != "regression":
        stages.append(StringIndexer(inputCol=data.label.column, outputCol="label"))
    return Pipeline(stages=stages)


def spark_ml_run(spark, config: Path, overrides: list[str], make_model: Callable, metric: str) -> Run:
    """Read, featurise, fit and evaluate with Spark ML alone; the clock covers all of it."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator, RegressionEvaluator
    from pyspark.sql import functions as F

    start = time.perf_counter()
    train, test, data = typed_frames(spark, config, overrides)
    if data.label.task == "regression":
        train, test = (f.withColumn("label", F.col(data.label.column).cast("double")) for f in (train, test))
    featurise = features_pipeline(data).fit(train)
    fitting = featurise.transform(train).select("features", "label").cache()
    width = len(fitting.first()["features"])
    model = make_model(width).fit(fitting)
    scored = model.transform(featurise.transform(test))
    if metric == "accuracy":
        value = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    else:
        value = RegressionEvaluator(metricName=metric).evaluate(scored)
    fitting.unpersist()
    return Run(time.perf_counter() - start, value)


def adult_models() -> dict[str, Callable]:
    from pyspark.ml.classification import GBTClassifier, LogisticRegression, MultilayerPerceptronClassifier

    return {
        "logistic": lambda width: LogisticRegression(maxIter=100),
        "gbt": lambda width: GBTClassifier(maxIter=50, seed=7),
        "mlp": lambda width: MultilayerPerceptronClassifier(
            layers=[width, 128, 64, 2], maxIter=100, blockSize=128, seed=7
        ),
    }


def diamonds_models() -> dict[str, Callable]:
    from pyspark.ml.regression import GBTRegressor, LinearRegression

    return {
        "linear": lambda width: LinearRegression(maxIter=100),
        "gbt": lambda width: GBTRegressor(maxIter=50, seed=7),
    }


@dataclass(frozen=True)
class Case:
    name: str
    config: Path
    overrides: tuple[str, ...]
    metric: str  # accuracy (higher is better) or rmse (lower)
    models: Callable[[], dict[str, Callable]]


def cases(data_dir: str) -> list[Case]:
    diamonds = [
        f"data.train_path={data_dir}/diamonds/train.csv",
        f"data.test_path={data_dir}/diamonds/test.csv",
    ]
    return [
        Case("adult", ROOT / "conf" / "adult.yaml", (), "accuracy", adult_models),
        Case("diamonds", ROOT / "conf" / "diamonds.yaml", tuple(diamonds), "rmse", diamonds_models),
    ]


def measure(spark, case: Case, rounds: int) -> dict[str, list[Run]]:
    """Every side once per round, in turn (reversed in odd rounds), after one unrecorded warm-up
    of each (the session's first Python workers and JIT)."""
    overrides = list(case.overrides)
    sides = {"ours": lambda: our_run(spark, case.config, overrides, case.metric)}
    for name, make in case.models().items():
        sides[name] = lambda make=make: spark_ml_run(spark, case.config, overrides, make, case.metric)
    for run in sides.values():
        run()
    runs: dict[str, list[Run]] = {name: [] for name in sides}
    for i in range(rounds):
        for name in in_turn(list(sides), i):
            runs[name].append(sides[name]())
            print(f"  {case.name} {name}: {runs[name][-1]}", flush=True)
    return runs


def rows_for(case: Case, runs: dict[str, list[Run]]) -> list[dict]:
    higher = case.metric == "accuracy"
    metric = {name: Measured([r.metric for r in rs]) for name, rs in runs.items()}
    seconds = {name: Measured([r.seconds for r in rs]) for name, rs in runs.items()}
    models = [name for name in runs if name != "ours"]
    best = (max if higher else min)(models, key=lambda name: metric[name])
    summary = ", ".join(f"{name} {metric[name]:.4f} in {seconds[name]:.0f} s" for name in models)
    rows = [
        entry(
            f"spark_ml_{case.name}_{case.metric}_vs_best",
            metric["ours"],
            metric[best],
            case.metric,
            "higher" if higher else "lower",
            1.0,
            note=f"best Spark ML model: {best}; Spark ML: {summary}",
        )
    ]
    for name in models:
        target = 1.0 if name == "mlp" else None  # the bar: faster than Spark ML's MLP
        rows.append(
            entry(
                f"spark_ml_{case.name}_time_vs_{name}",
                seconds["ours"],
                seconds[name],
                "s",
                "lower",
                target,
                note=f"end to end, raw CSV to the test {case.metric}: ours {metric['ours']:.4f}, "
                f"{name} {metric[name]:.4f}",
            )
        )
    return rows


def main(spark=None, rounds: int = 2) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.data.examples import write_diamonds
    from sparkml_dist.spark import build_session

    own = spark is None
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-spark-ml"))
    spark.sparkContext.setLogLevel("ERROR")
    data_dir = scratch_dir()
    write_diamonds(Path(data_dir))
    rows = []
    for case in cases(data_dir):
        rows += rows_for(case, measure(spark, case, rounds))
    if own:
        spark.stop()
    if any(not math.isfinite(r["ratio"]) for r in rows):
        raise RuntimeError(f"a run gave no metric: {rows}")
    record(rows)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    main(rounds=parser.parse_args().rounds)
