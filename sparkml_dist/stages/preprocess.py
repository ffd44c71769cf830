"""Stage 1: raw CSV -> quarantined rejects + fitted features -> Parquet splits + manifest."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pyspark.ml import PipelineModel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.atomic import atomic_dir
from sparkml_dist.data.dataset import MANIFEST, Manifest, describe_split, split_frame, write_split
from sparkml_dist.data.features import FEATURES, build_feature_pipeline, feature_names, to_feature_frame
from sparkml_dist.data.ingest import IngestResult, ingest
from sparkml_dist.data.sources import fingerprint, resolve_path
from sparkml_dist.errors import ConfigError
from sparkml_dist.spark.session import job_phase
from sparkml_dist.stages.paths import OutputPaths

log = logging.getLogger(__name__)


@dataclass
class PreprocessResult:
    path: str
    manifest: Manifest

    @property
    def feature_pipeline(self) -> str:
        return str(Path(self.path) / "feature_pipeline")


def preprocess(spark: SparkSession, cfg: JobConfig, fitted: PipelineModel | None = None, where: str | None = None,
               out: Path | None = None) -> PreprocessResult:
    """Fit the feature pipeline on the training rows (or reuse `fitted`, a model's own, when
    fine-tuning) and write the splits; `where` keeps only the rows it matches."""
    data = cfg.data
    out = out or OutputPaths.of(cfg).preprocess
    inputs = {}
    for name, location in (("train", data.train_path), ("test", data.test_path)):
        with job_phase(spark, f"preprocess: ingest {name}"):
            inputs[name] = ingest(spark, location, data)
        log.info("ingest %s: %s", name, inputs[name].counts())
    accepted = {name: select_rows(r.accepted, where) for name, r in inputs.items()}
    train_rows, val_rows = split_frame(accepted["train"], data.validation_fraction, data.split_seed)
    with job_phase(spark, "preprocess: fit features"):
        pipeline = fitted or build_feature_pipeline(data, cfg.features).fit(train_rows)
        frames = {name: to_feature_frame(pipeline, df) for name, df in
                  (("train", train_rows), ("val", val_rows), ("test", accepted["test"]))}
        dim = frames["train"].select(F.size(FEATURES)).first()[0]
    ranks = cfg.train.num_ranks
    with atomic_dir(spark, str(out)) as staging:
        pipeline.save(f"{staging}/feature_pipeline")
        for name, frame in frames.items():
            files = ranks * data.files_per_rank if name == "train" else ranks
            with job_phase(spark, f"preprocess: write {name}"):
                write_split(frame, f"{staging}/{name}", files, data.row_group_rows, dim)
        with job_phase(spark, "preprocess: rejects and manifest"):
            _write_rejects(inputs, f"{staging}/rejects")
            manifest = _manifest(spark, cfg, Path(staging), pipeline, train_rows, dim, inputs)
        (Path(staging) / MANIFEST).write_text(manifest.to_json())
    return PreprocessResult(str(out), manifest)


def select_rows(rows: DataFrame, where: str | None) -> DataFrame:
    """The rows a Spark SQL predicate over the raw columns keeps; a bad predicate names the key."""
    if not where:
        return rows
    try:
        return rows.where(F.expr(where)).select(*rows.columns)
    except AnalysisException as exc:  # ParseException is one too  # unknown column, type error: raised here, before any job
        raise ConfigError(f"finetune.where: {where!r} is not a valid predicate over the columns "
                          f"{[c for c in rows.columns if not c.startswith('_')]}: {str(exc).splitlines()[0]}") from None


def _write_rejects(inputs: dict[str, IngestResult], path: str) -> None:
    frames = [r.rejects.withColumn("input", F.lit(name)) for name, r in inputs.items()]
    union: DataFrame = frames[0]
    for f in frames[1:]:
        union = union.unionByName(f)
    union.coalesce(1).write.mode("overwrite").parquet(path)


def _manifest(spark, cfg: JobConfig, staging: Path, pipeline, train_rows, dim: int,
              inputs: dict[str, IngestResult]) -> Manifest:
    splits = {name: describe_split(spark.read.parquet(str(staging / name)), staging / name)
              for name in ("train", "val", "test")}
    schema = {c.name: f"{c.type}/{c.role}" for c in cfg.data.columns}
    return Manifest(
        feature_dim=dim,
        feature_names=feature_names(pipeline, train_rows),
        splits=splits,
        input_fingerprint=fingerprint([resolve_path(cfg.data.train_path), resolve_path(cfg.data.test_path)]),
        inputs={name: r.counts() for name, r in inputs.items()},
        schema=schema,
        layout={"num_ranks": cfg.train.num_ranks, "files_per_rank": cfg.data.files_per_rank,
                "row_group_rows": cfg.data.row_group_rows},
    )
