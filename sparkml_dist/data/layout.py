"""Compact feature storage: the training splits hold one column per source feature (a scaled
number, or a category's index) and each rank rebuilds the dense vector the model sees.

Writing the dense one-hot vector (116 floats a row for Adult) cost Spark more than all the
feature engineering before it; an index per category is 8 ints instead of 110 floats, and
turning indices into one-hot slots is one numpy scatter per batch on the rank.

A wide run of numbers (MNIST's 784 pixels) is one `array<float>` column instead (a VALUES
block): hundreds of Parquet columns cost Spark a column writer, statistics and a page per
column per row group, and cost the scoring UDF an Arrow column each (docs/benchmarks.md, "Wide
rows").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkml_dist.errors import DataError

VALUE = "value"  # one float slot
ONEHOT = "onehot"  # `size` slots; the stored int picks the one that is 1
VALUES = "values"  # `size` float slots, stored as one array<float> column of that length


@dataclass(frozen=True)
class FeatureBlock:
    column: str  # the Parquet column
    kind: str  # VALUE | ONEHOT | VALUES
    size: int  # slots it fills in the dense vector

    @property
    def width(self) -> int:
        """Floats it holds in a compact row: its values, or one (a value or a category's index)."""
        return self.size if self.kind == VALUES else 1


@dataclass(frozen=True)
class FeatureLayout:
    blocks: tuple[FeatureBlock, ...]

    @property
    def dim(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def columns(self) -> list[str]:
        return [b.column for b in self.blocks]

    @property
    def compact_width(self) -> int:
        """Floats in a compact row (`compact`): one per block, a VALUES block's `size`."""
        return sum(b.width for b in self.blocks)

    @property
    def row_bytes(self) -> int:
        """Stored bytes per row (4 per compact float), for sizing Parquet row groups."""
        return 4 * self.compact_width

    def compact_slots(self) -> list[tuple[int, bool]]:
        """For each float of a compact row, its dense offset and whether it is a category's
        index (a one-hot block's) rather than a value."""
        out: list[tuple[int, bool]] = []
        offset = 0
        for block in self.blocks:
            if block.kind == VALUES:
                out.extend((offset + i, False) for i in range(block.size))
            else:
                out.append((offset, block.kind == ONEHOT))
            offset += block.size
        return out

    def to_json(self) -> list[dict]:
        return [asdict(b) for b in self.blocks]

    @staticmethod
    def from_json(raw: list[dict] | None) -> FeatureLayout | None:
        return None if raw is None else FeatureLayout(tuple(FeatureBlock(**b) for b in raw))

    def to_dense(self, table: pa.Table | pa.RecordBatch, where: str = "") -> np.ndarray:
        """The stored columns -> the float32 [rows, dim] matrix the model was built for."""
        return self.expand(self.compact(table, where))

    def compact(self, table: pa.Table | pa.RecordBatch, where: str = "") -> np.ndarray:
        """The stored columns as a float32 [rows, compact_width] matrix: a value, a category's
        index (exact in float32 below 2**24 slots), or a VALUES block's values. Rows are shuffled
        and batched in this form and made dense one batch at a time: a one-hot block thousands of
        slots wide (an airline's tail numbers) would otherwise make a shuffle buffer of a few row
        groups hundreds of MiB."""
        out = np.empty((table.num_rows, self.compact_width), np.float32)
        start = 0
        for block in self.blocks:
            column = table.column(block.column)
            if block.kind == VALUES:
                out[:, start : start + block.size] = _fixed_lists(column, block, table.num_rows, where)
            else:
                values = column.to_numpy()
                if block.kind == ONEHOT and len(values) and (values.min() < 0 or values.max() >= block.size):
                    raise DataError(
                        f"{where}: column '{block.column}' holds an index outside [0, {block.size}); "
                        f"the file does not match its manifest. Re-run the preprocess stage."
                    )
                out[:, start] = values
            start += block.width
        return out

    def expand(self, compact: np.ndarray) -> np.ndarray:
        """`compact`'s [rows, compact_width] -> the dense float32 [rows, dim] matrix."""
        rows = len(compact)
        out = np.zeros((rows, self.dim), np.float32)
        start = offset = 0
        for block in self.blocks:
            if block.kind == ONEHOT:
                out[np.arange(rows), offset + compact[:, start].astype(np.int64)] = 1.0
            else:
                out[:, offset : offset + block.width] = compact[:, start : start + block.width]
            start += block.width
            offset += block.size
        return out


def _fixed_lists(column, block: FeatureBlock, rows: int, where: str) -> np.ndarray:
    """A VALUES block's list column -> float32 [rows, size], refusing a null list or value and a
    list of another length (a file that does not match its manifest)."""
    chunks = [c for c in (column.chunks if hasattr(column, "chunks") else [column]) if len(c)]
    lengths = [pc.min_max(pc.list_value_length(c)).values() for c in chunks]
    flat = [c.flatten() for c in chunks]
    values = np.concatenate([f.to_numpy(zero_copy_only=False) for f in flat]) if flat else np.empty(0)
    if (
        column.null_count
        or sum(f.null_count for f in flat)
        or any((low.as_py(), high.as_py()) != (block.size, block.size) for low, high in lengths)
    ):
        raise DataError(
            f"{where}: column '{block.column}' does not hold {block.size} numbers in every row; the "
            f"file does not match its manifest. Re-run the preprocess stage."
        )
    return values.reshape(rows, block.size).astype(np.float32, copy=False)
