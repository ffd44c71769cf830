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
    def from_json(raw: list[dict] | None) -> "FeatureLayout | None":
        return None if raw is None else FeatureLayout(tuple(FeatureBlock(**b) for b in raw))

    def to_dense(self, table: pa.Table, where: str = "") -> np.ndarray:
        """The stored columns -> the float32 [rows, dim] matrix the model was built for."""
        rows = table.num_rows
        out = np.zeros((rows, self.dim), np.float32)
        offset = 0
        for block in self.blocks:
            values = table.column(block.column).to_numpy()
            if block.kind == ONEHOT:
                if rows and (values.min() < 0 or values.max() >= block.size):
                    raise DataError(f"{where}: column '{block.column}' holds an index outside [0, {block.size}); "
                                    f"the file does not match its manifest. Re-run the preprocess stage.")
                out[np.arange(rows), offset + values] = 1.0
            else:
                out[:, offset] = values
            offset += block.size
        return out
