"""The fitted feature pipeline as plain data, applied to raw rows in numpy: no Spark needed.

`data.features.raw_features` reads the fitted Spark ML stages (imputer surrogates, scaler mean
and std, indexer labels) into these slots; `data.features.compile_features` turns the same slots
into SQL for Spark, and `RawFeatures.dense` computes them here with the same double-precision
arithmetic, so both give the model the same float32 matrix. This is what lets the logged pyfunc
model score raw rows anywhere MLflow serves (`tracking.pyfunc_model`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sparkml_dist.data.layout import ONEHOT, VALUE, VALUES, FeatureBlock, FeatureLayout

MISSING_CATEGORY = "__missing__"  # what a missing category is indexed as (the indexer saw it in training)
RAW_FEATURES_FILE = "raw_features.json"  # written inside a saved feature pipeline's directory
# From this many numbers in a row the stored splits keep them in one array column (data/layout.py:
# VALUES). Measured on MNIST's 784 pixels: the training split written in about half the time and
# read faster by the ranks (docs/benchmarks.md, "Wide rows"); a few numbers stay a column each,
# as readable in the Parquet files as in the source.
WIDE_NUMBERS = 64


@dataclass(frozen=True)
class NumericSlot:
    """Imputer, then optionally StandardScaler: missing (null or NaN) -> surrogate; scaled is
    (x - mean) * inv_std, with inv_std 0 where the training std was 0."""

    name: str  # the block's column
    source: str
    surrogate: float
    mean: float | None = None
    inv_std: float | None = None


@dataclass(frozen=True)
class CategorySlot:
    """StringIndexer (handleInvalid=keep): a value's position in `labels`, len(labels) for one
    never seen in training; one-hot over `size` slots, or the index as one number."""

    name: str
    source: str
    labels: tuple[str, ...]
    one_hot: bool
    size: int


Slot = NumericSlot | CategorySlot


class RawRowError(ValueError):
    """A raw row that cannot be scored, with the column and the reason."""


@dataclass(frozen=True)
class RawFeatures:
    slots: tuple[Slot, ...]

    @property
    def layout(self) -> FeatureLayout:
        return FeatureLayout(tuple(block for block, _ in self.blocks()))

    def blocks(self) -> list[tuple[FeatureBlock, tuple[Slot, ...]]]:
        """The stored blocks in the dense vector's order, each with the slots it holds: a block
        per slot, except that a run of at least `WIDE_NUMBERS` numeric slots is one VALUES block
        (one array column; data/layout.py)."""
        out: list[tuple[FeatureBlock, tuple[Slot, ...]]] = []
        run: list[NumericSlot] = []

        def close_run() -> None:
            if len(run) >= WIDE_NUMBERS:
                out.append((FeatureBlock(self._values_column(), VALUES, len(run)), tuple(run)))
            else:
                out.extend((FeatureBlock(s.name, VALUE, 1), (s,)) for s in run)
            run.clear()

        for slot in self.slots:
            if isinstance(slot, NumericSlot):
                run.append(slot)
                continue
            close_run()
            kind, size = (ONEHOT, slot.size) if slot.one_hot else (VALUE, 1)
            out.append((FeatureBlock(slot.name, kind, size), (slot,)))
        close_run()
        return out

    def _values_column(self) -> str:
        """The VALUES block's column: a name no source column or slot has (the scoring frame
        passes source columns through beside the blocks)."""
        taken = {s.source for s in self.slots} | {s.name for s in self.slots}
        name = "numeric__values"
        while name in taken:
            name = f"_{name}"
        return name

    @property
    def names(self) -> list[str]:
        """Each slot of the dense vector by name, as Spark ML's attributes name a one-hot slot
        (`<column>__onehot_<value>`, `__unknown` for a value never seen in training) and an
        index (`<column>__index`); a number by its column and what was done to it
        (`<column>__scaled`, `<column>__imputed`)."""
        names: list[str] = []
        for slot in self.slots:
            if isinstance(slot, CategorySlot) and slot.one_hot:
                values = [*slot.labels, "__unknown"][: slot.size]
                names.extend(f"{slot.source}__onehot_{value}" for value in values)
            else:
                names.append(slot.name)
        return names

    @property
    def numeric_columns(self) -> list[str]:
        return [s.source for s in self.slots if isinstance(s, NumericSlot)]

    @property
    def categorical_columns(self) -> list[str]:
        return [s.source for s in self.slots if isinstance(s, CategorySlot)]

    def dense(self, frame) -> np.ndarray:
        """A pandas DataFrame of raw columns -> the float32 [rows, dim] matrix the model reads.
        Raises `RawRowError` naming the column for a missing column, a value that is not a
        number in a numeric column, or an infinite number."""
        missing = [c for c in dict.fromkeys(s.source for s in self.slots) if c not in frame.columns]
        if missing:
            raise RawRowError(
                f"missing column(s) {missing}; the model reads {self.numeric_columns} (numbers) and "
                f"{self.categorical_columns} (categories)"
            )
        rows = len(frame)
        out = np.zeros((rows, self.layout.dim), np.float32)
        offset = 0
        for slot in self.slots:
            if isinstance(slot, NumericSlot):
                out[:, offset] = _numeric(frame[slot.source], slot)
                offset += 1
            else:
                index = _category_index(frame[slot.source], slot)
                if slot.one_hot:
                    out[np.arange(rows), offset + index] = 1.0
                else:
                    out[:, offset] = index
                offset += slot.size if slot.one_hot else 1
        return out

    def to_json(self) -> list[dict]:
        return [
            {"kind": "numeric" if isinstance(s, NumericSlot) else "category", **asdict(s)} for s in self.slots
        ]

    @staticmethod
    def from_json(raw: list[dict]) -> RawFeatures:
        slots: list[Slot] = []
        for entry in raw:
            fields = {k: v for k, v in entry.items() if k != "kind"}
            if entry["kind"] == "numeric":
                slots.append(NumericSlot(**fields))
            else:
                slots.append(CategorySlot(**{**fields, "labels": tuple(fields["labels"])}))
        return RawFeatures(tuple(slots))


def _numeric(values, slot: NumericSlot) -> np.ndarray:
    """As Spark computes it: CAST(x AS DOUBLE), the surrogate where null or NaN, the scaling in
    double, then float32."""
    try:
        x = np.array([math.nan if v is None else v for v in values.tolist()], dtype=np.float64)
    except (TypeError, ValueError):
        bad = next(v for v in values.tolist() if not _is_number(v))
        raise RawRowError(f"column '{slot.source}': {bad!r} is not a number") from None
    if np.isinf(x).any():
        raise RawRowError(
            f"column '{slot.source}': {float(x[np.isinf(x)][0])!r} is not finite; send a number, or null "
            f"for a missing value (imputed as in training)"
        )
    x = np.where(np.isnan(x), slot.surrogate, x)
    if slot.mean is not None and slot.inv_std is not None:
        x = (x - slot.mean) * slot.inv_std
    return x.astype(np.float32)


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return value is None
    return True


def _category_index(values, slot: CategorySlot) -> np.ndarray:
    """As Spark computes it: CAST(x AS STRING) (booleans as true/false), missing as its own
    category, and len(labels) for a value never seen in training."""
    position = {label: i for i, label in enumerate(slot.labels)}
    unseen = len(slot.labels)
    return np.array([position.get(_as_spark_string(v), unseen) for v in values.tolist()], dtype=np.int64)


def _as_spark_string(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING_CATEGORY
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    return str(value)  # for a float as for Spark's cast: 3.0 -> '3.0'
