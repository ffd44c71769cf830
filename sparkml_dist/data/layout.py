"""Compact feature storage: the training splits hold one column per source feature (a scaled
number, or a category's index) and each rank rebuilds the dense vector the model sees.

Writing the dense one-hot vector (116 floats a row for Adult) cost Spark more than all the
feature engineering before it; an index per category is 8 ints instead of 110 floats, and
turning indices into one-hot slots is one numpy scatter per batch on the rank.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from sparkml_dist.errors import DataError

VALUE = "value"  # one float slot
ONEHOT = "onehot"  # `size` slots; the stored int picks the one that is 1


@dataclass(frozen=True)
class FeatureBlock:
    column: str  # the Parquet column
    kind: str  # VALUE | ONEHOT
    size: int  # slots it fills in the dense vector


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
    def row_bytes(self) -> int:
        """Stored bytes per row (4 per block), for sizing Parquet row groups."""
        return 4 * len(self.blocks)

    def to_json(self) -> list[dict]:
        return [asdict(b) for b in self.blocks]

    @staticmethod
    def from_json(raw: list[dict] | None) -> FeatureLayout | None:
        return None if raw is None else FeatureLayout(tuple(FeatureBlock(**b) for b in raw))

    def to_dense(self, table: pa.Table | pa.RecordBatch, where: str = "") -> np.ndarray:
        """The stored columns -> the float32 [rows, dim] matrix the model was built for."""
        return self.expand(self.compact(table, where))

    def compact(self, table: pa.Table | pa.RecordBatch, where: str = "") -> np.ndarray:
        """The stored columns as a float32 [rows, blocks] matrix: a value, or a category's index
        (exact in float32 below 2**24 slots). Rows are shuffled and batched in this form and made
        dense one batch at a time: a one-hot block thousands of slots wide (an airline's tail
        numbers) would otherwise make a shuffle buffer of a few row groups hundreds of MiB."""
        out = np.empty((table.num_rows, len(self.blocks)), np.float32)
        for i, block in enumerate(self.blocks):
            values = table.column(block.column).to_numpy()
            if block.kind == ONEHOT and len(values) and (values.min() < 0 or values.max() >= block.size):
                raise DataError(
                    f"{where}: column '{block.column}' holds an index outside [0, {block.size}); "
                    f"the file does not match its manifest. Re-run the preprocess stage."
                )
            out[:, i] = values
        return out

    def expand(self, compact: np.ndarray) -> np.ndarray:
        """`compact`'s [rows, blocks] -> the dense float32 [rows, dim] matrix."""
        rows = len(compact)
        out = np.zeros((rows, self.dim), np.float32)
        offset = 0
        for i, block in enumerate(self.blocks):
            if block.kind == ONEHOT:
                out[np.arange(rows), offset + compact[:, i].astype(np.int64)] = 1.0
            else:
                out[:, offset] = compact[:, i]
            offset += block.size
        return out
