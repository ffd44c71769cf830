"""DataFrame-fed ranks. The driver checks the DataFrame's columns (numbers, booleans, arrays of
numbers, Spark ML vectors) before any rank starts; each rank then reads its share, spilled to its
local disk by the barrier task, through `dataframe_loader()`:

    def train(lr):
        loader = sd.dataframe_loader(batch_size=128, label="label")   # x: every other column
        for epoch in range(5):
            loader.set_epoch(epoch)
            for x, y in loader: ...

Every rank takes the same number of steps each epoch (the largest share; smaller shares repeat
rows of their own), which DDP needs: a rank that ran out of batches would leave the others
waiting in an allreduce."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np

from sparkml_dist.distributor.job import PARTITION_FILE, PARTITION_ROWS
from sparkml_dist.errors import DataError

_NUMERIC = (
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "FloatType",
    "DoubleType",
    "BooleanType",
    "DecimalType",
)


def frame_for_ranks(df):
    """`df` with Spark ML vector columns as arrays; a clear error for columns no tensor can hold."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    if not df.columns:
        raise DataError("the DataFrame for the ranks has no columns")
    selected = []
    for field in df.schema.fields:
        kind = type(field.dataType).__name__
        if kind == "VectorUDT":
            selected.append(vector_to_array(F.col(field.name), "float32").alias(field.name))
        elif kind in _NUMERIC or (
            isinstance(field.dataType, ArrayType) and type(field.dataType.elementType).__name__ in _NUMERIC
        ):
            selected.append(F.col(field.name))
        else:
            raise DataError(
                f"column {field.name!r} has type {field.dataType.simpleString()}, which no tensor holds; the "
                f"ranks take numbers, booleans, arrays of numbers and Spark ML vectors. Encode it first "
                f"(StringIndexer / OneHotEncoder, or a cast), or drop it: df.drop({field.name!r})"
            )
    return df.select(*selected)


class PartitionLoader:
    """Batches of this rank's share of the DataFrame, as torch tensors.

    With `label`: `(x, y)` where x is float32 [batch, width] made of `features` (default: every
    other column; array columns contribute their elements) and y keeps the label's kind (int64 for
    integer labels, for CrossEntropyLoss; float32 otherwise). Without: a dict of column tensors."""

    def __init__(
        self,
        batch_size: int,
        label: str | None = None,
        features: list[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        import pyarrow as pa

        path, rows_per_rank = _partition_from_env()
        self.rank = int(os.environ.get("RANK", 0))
        table = pa.ipc.open_file(pa.memory_map(path)).read_all() if path else None
        if table is None or table.num_rows == 0:
            raise DataError(
                f"rank {self.rank} got no rows of the DataFrame (shares per rank: {rows_per_rank}); "
                f"use fewer processes than rows"
            )
        self.table = table
        names = self.table.column_names
        missing = [c for c in [*(features or []), *([label] if label else [])] if c not in names]
        if missing:
            raise DataError(f"dataframe_loader: no column(s) {missing} in the DataFrame; it has {names}")
        nulls = [c for c in names if self.table.column(c).null_count]
        if nulls:
            raise DataError(
                f"rank {self.rank}: column(s) {nulls} hold nulls, which no tensor holds; fill or drop "
                f"them before the launch (df.na.fill(...) / df.na.drop(subset={nulls}))"
            )
        self.label = label
        self.features = features if features is not None else [c for c in names if c != label]
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rows_per_epoch = max(rows_per_rank)
        self.epoch = 0

    @property
    def num_rows(self) -> int:
        """Rows of this rank's own share (an epoch takes `rows_per_epoch`, the largest share)."""
        return self.table.num_rows

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler.set_epoch: a different shuffle each epoch, the same on a re-run."""
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.rows_per_epoch, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator:
        order = self._order()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield self._batch(self.table.take(order[start : start + self.batch_size]))

    def _order(self) -> np.ndarray:
        rows = self.table.num_rows
        rng = np.random.default_rng([self.seed, self.epoch, self.rank])
        own = rng.permutation(rows) if self.shuffle else np.arange(rows)
        repeats = -(-self.rows_per_epoch // rows)
        return np.tile(own, repeats)[: self.rows_per_epoch]

    def _batch(self, table):
        import torch

        if self.label is None:
            return {name: torch.from_numpy(_column(table, name)) for name in table.column_names}
        x = np.concatenate([_as_matrix(_column(table, name)) for name in self.features], axis=1)
        y = _column(table, self.label)
        y = y.astype(np.int64) if y.dtype.kind in "iub" else y.astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y)


def dataframe_loader(
    batch_size: int,
    label: str | None = None,
    features: list[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> PartitionLoader:
    """Inside a function run by `TorchDistributor.run_on_dataframe`: a loader over this rank's rows."""
    return PartitionLoader(batch_size, label, features, shuffle, seed, drop_last)


def _partition_from_env() -> tuple[str, list[int]]:
    if PARTITION_ROWS not in os.environ:
        raise RuntimeError(
            "dataframe_loader() is only available inside a function launched by "
            "TorchDistributor.run_on_dataframe(fn, df, ...)"
        )
    return os.environ[PARTITION_FILE], json.loads(os.environ[PARTITION_ROWS])


def _column(table, name: str) -> np.ndarray:
    import pyarrow as pa

    column = table.column(name).combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        return flat.reshape(len(column), -1) if len(column) else np.empty((0, 0), np.float32)
    values = column.to_numpy(zero_copy_only=False)
    return values.astype(np.float32) if values.dtype == object else values  # decimals arrive as objects


def _as_matrix(values: np.ndarray) -> np.ndarray:
    return values.reshape(len(values), -1).astype(np.float32, copy=False)
