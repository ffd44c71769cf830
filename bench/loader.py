"""Rank-side loader throughput: our ShardLoader (row-group reads, seeded shuffle buffer, numpy
batches, torch tensors) vs a raw pyarrow.dataset scan of the same files.

    .venv/bin/python -m bench.loader [--rows 2000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

from bench.common import alternate, entry, record

DIM = 32


def write_dataset(root: Path, rows: int, files: int = 4, row_group: int = 8192):
    from sparkml_dist.data.dataset import RowGroup

    rng = np.random.default_rng(0)
    (root / "train").mkdir(parents=True)
    groups = []
    per_file = rows // files
    for f in range(files):
        x = rng.random((per_file, DIM), dtype=np.float32)
        table = pa.table(
            {
                "features": pa.FixedSizeListArray.from_arrays(x.ravel(), DIM).cast(pa.list_(pa.float32())),
                "label": pa.array((x[:, 0] > 0.5).astype(np.float32)),
            }
        )
        rel = f"train/part-{f}.parquet"
        pq.write_table(table, root / rel, row_group_size=row_group)
        meta = pq.ParquetFile(root / rel).metadata
        groups += [RowGroup(rel, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return groups


def ours(root: Path, groups, batch: int) -> float:
    from sparkml_dist.data.loader import ShardLoader

    loader = ShardLoader(root, groups, 0, 1, batch, seed=1, shuffle=True, buffer_row_groups=4)
    t0 = time.perf_counter()
    n = 0
    for x, y in loader.epoch(0):
        torch.from_numpy(y)  # the tensors a training step would take
        n += len(torch.from_numpy(x))
    return n / (time.perf_counter() - t0)


def raw_pyarrow(root: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    for b in ds.dataset(root / "train", format="parquet").to_batches(columns=["features", "label"]):
        n += b.num_rows
    return n / (time.perf_counter() - t0)


def main(rows: int = 2_000_000) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows)
        o, b = alternate(lambda: ours(root, groups, 1024), lambda: raw_pyarrow(root), rounds=5)
    rows_out = [
        entry(
            "loader_vs_pyarrow",
            o,
            b,
            "rows/s",
            "higher",
            0.7,
            note=f"{rows:,} rows x {DIM} float32, batch 1024, shuffle buffer 4 row groups",
        )
    ]
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    main(parser.parse_args().rows)
