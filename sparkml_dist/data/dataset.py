"""The training dataset on disk: Parquet splits laid out for N ranks, plus a manifest.

Layout under a preprocess output directory (a path or URI, see sparkml_dist.storage):
  train/ val/ test/   Parquet: row_id, one column per feature block (manifest feature_layout,
                      see data/layout.py), label; or, with no layout, features (array<float>)
  rejects/            quarantined input lines with a reason
  feature_pipeline/   the fitted Spark ML PipelineModel
  manifest.json       schema, feature dims, per-split and per-file row counts, label balance
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from sparkml_dist import storage
from sparkml_dist.errors import DataError
from sparkml_dist.tasks.base import Target

if TYPE_CHECKING:  # Spark is imported where a split is written; ranks read manifests without it
    from pyspark.sql import DataFrame

LABEL = "label"  # the encoded label's column in every split (data.ingest writes it under this name)

MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class RowGroup:
    file: str  # path relative to the dataset root
    index: int
    rows: int


@dataclass
class SplitInfo:
    rows: int
    label_counts: dict[str, int]
    files: dict[str, int]  # relative file -> rows
    row_groups: list[RowGroup] = field(default_factory=list)


@dataclass
class Manifest:
    feature_dim: int
    feature_names: list[str]
    splits: dict[str, SplitInfo]
    input_fingerprint: str
    inputs: dict[str, dict[str, int]]  # source -> {input, accepted, rejected}
    schema: dict[str, str]
    layout: dict[str, int]
    feature_layout: list[dict] | None = None  # FeatureLayout.to_json(); None: a dense `features` column
    target: dict | None = None  # tasks.Target.to_json(); None: written before targets (binary)
    weighted: bool = False  # the splits hold a `weight` column (data.weight_column)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, root: str) -> str:
        """Write `manifest.json` under `root` (a path or URI), atomically."""
        return storage.write_text(storage.join(root, MANIFEST), self.to_json())

    @staticmethod
    def load(root: str) -> Manifest:
        path = storage.join(str(root), MANIFEST)
        if not storage.exists(path):
            raise DataError(f"no {MANIFEST} under {root}: run the preprocess stage first")
        raw = storage.read_json(path)
        splits = {
            name: SplitInfo(
                s["rows"], s["label_counts"], s["files"], [RowGroup(**g) for g in s["row_groups"]]
            )
            for name, s in raw["splits"].items()
        }
        return Manifest(
            raw["feature_dim"],
            raw["feature_names"],
            splits,
            raw["input_fingerprint"],
            raw["inputs"],
            raw["schema"],
            raw["layout"],
            raw.get("feature_layout"),
            raw.get("target"),
            raw.get("weighted", False),
        )

    @property
    def target_spec(self) -> Target:
        return Target.from_json(self.target)


@dataclass
class PreprocessResult:
    """A preprocessed dataset: where it is (a path or URI) and its manifest."""

    path: str
    manifest: Manifest

    @property
    def feature_pipeline(self) -> str:
        return storage.join(self.path, "feature_pipeline")

    @staticmethod
    def load(path: str) -> PreprocessResult:
        return PreprocessResult(path, Manifest.load(path))


def write_split(df: DataFrame, path: str, num_files: int, row_group_rows: int, feature_bytes: int) -> None:
    """Write one split as `num_files` balanced files with row groups of about `row_group_rows`."""
    # parquet.block.size is in bytes of the in-memory buffer; size it from the row width so
    # each file holds several row groups that ranks can share out.
    row_bytes = feature_bytes + 32
    block = max(row_group_rows * row_bytes, 64 * 1024)
    (
        df.repartition(num_files)
        .write.mode("overwrite")
        .option("parquet.block.size", str(block))
        .option("compression", "snappy")
        .parquet(storage.spark_path(path))
    )


def describe_split(split_dir: str, classes: int = 2) -> SplitInfo:
    """Row counts (and per class label counts, for a classifier's `classes`) and per-file row
    groups, from the written files themselves (their footers and label column: a few MB read
    instead of a Spark job per split)."""
    files: dict[str, int] = {}
    groups: list[RowGroup] = []
    labels: dict[str, int] = {}
    for f in storage.list_files(split_dir, suffix=".parquet"):
        parquet = pq.ParquetFile(storage.open_input(f))
        meta = parquet.metadata
        rel = f"{storage.name_of(split_dir)}/{storage.name_of(f)}"
        files[rel] = meta.num_rows
        groups.extend(RowGroup(rel, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups))
        if not classes:  # a regression label has values, not classes
            continue
        counts = parquet.read(columns=[LABEL]).column(LABEL).value_counts()
        for value, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            key = str(int(value))
            labels[key] = labels.get(key, 0) + count
    return SplitInfo(
        sum(files.values()), dict(sorted(labels.items(), key=lambda kv: int(kv[0]))), files, groups
    )


def split_frame(df: DataFrame, fraction: float, seed: int) -> tuple[DataFrame, DataFrame]:
    """Deterministic split by a hash of row_id and the seed: same input, same split, any layout."""
    from pyspark.sql import functions as F

    bucket = F.abs(F.xxhash64(F.col("row_id"), F.lit(seed))) % 10_000
    cut = round(fraction * 10_000)
    return df.where(bucket >= cut), df.where(bucket < cut)
