"""The training dataset on disk: Parquet splits laid out for N ranks, plus a manifest.

Layout under a preprocess output directory:
  train/ val/ test/   Parquet, columns row_id, features (array<float>), label
  rejects/            quarantined input lines with a reason
  feature_pipeline/   the fitted Spark ML PipelineModel
  manifest.json       schema, feature dims, per-split and per-file row counts, label balance
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.data.ingest import LABEL
from sparkml_dist.errors import DataError

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def load(root: str | Path) -> "Manifest":
        path = Path(root) / MANIFEST
        if not path.is_file():
            raise DataError(f"no {MANIFEST} under {root}: run the preprocess stage first")
        raw = json.loads(path.read_text())
        splits = {
            name: SplitInfo(s["rows"], s["label_counts"], s["files"], [RowGroup(**g) for g in s["row_groups"]])
            for name, s in raw["splits"].items()
        }
        return Manifest(raw["feature_dim"], raw["feature_names"], splits, raw["input_fingerprint"],
                        raw["inputs"], raw["schema"], raw["layout"])


def write_split(df: DataFrame, path: str, num_files: int, row_group_rows: int, feature_dim: int) -> None:
    """Write one split as `num_files` balanced files with row groups of about `row_group_rows`."""
    # parquet.block.size is in bytes of the in-memory buffer; size it from the row width so
    # each file holds several row groups that ranks can share out.
    row_bytes = feature_dim * 4 + 32
    block = max(row_group_rows * row_bytes, 64 * 1024)
    (df.repartition(num_files).write.mode("overwrite")
       .option("parquet.block.size", str(block))
       .option("compression", "snappy")
       .parquet(path))


def describe_split(df: DataFrame, local_dir: Path) -> SplitInfo:
    """Row and label counts (one Spark aggregation) plus per-file row groups (Parquet footers)."""
    labels = {str(int(r[LABEL])): r["count"] for r in df.groupBy(LABEL).count().collect()}
    files: dict[str, int] = {}
    groups: list[RowGroup] = []
    for f in sorted(local_dir.glob("*.parquet")):
        meta = pq.ParquetFile(f).metadata
        rel = f"{local_dir.name}/{f.name}"
        files[rel] = meta.num_rows
        groups.extend(RowGroup(rel, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups))
    return SplitInfo(sum(files.values()), labels, files, groups)


def split_frame(df: DataFrame, fraction: float, seed: int) -> tuple[DataFrame, DataFrame]:
    """Deterministic split by a hash of row_id and the seed: same input, same split, any layout."""
    bucket = F.abs(F.xxhash64(F.col("row_id"), F.lit(seed))) % 10_000
    cut = int(round(fraction * 10_000))
    return df.where(bucket >= cut), df.where(bucket < cut)
