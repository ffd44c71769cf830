"""Rank-side streaming loader: each rank reads only its own contiguous slice of the rows,
row group by row group, with a deterministic per-epoch shuffle. Memory is bounded by the
shuffle buffer (a few row groups), never by the dataset."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkml_dist import storage
from sparkml_dist.data.dataset import Manifest, RowGroup
from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.errors import DataError


@dataclass(frozen=True)
class Piece:
    file: str
    row_group: int
    offset: int  # first row inside the row group
    length: int


def shard_pieces(groups: list[RowGroup], rank: int, world: int) -> list[Piece]:
    """Rows [total*rank/world, total*(rank+1)/world) as pieces of row groups: disjoint, covering,
    and balanced to within one row."""
    total = sum(g.rows for g in groups)
    lo, hi = total * rank // world, total * (rank + 1) // world
    pieces, start = [], 0
    for g in groups:
        end = start + g.rows
        a, b = max(lo, start), min(hi, end)
        if a < b:
            pieces.append(Piece(g.file, g.index, a - start, b - a))
        start = end
    return pieces


class ShardLoader:
    """Yields (features float32 [B, D], targets float32 [B, 2]) numpy batches for one rank; a
    target row is (encoded label, weight), the weight 1 unless the splits carry one."""

    def __init__(
        self,
        root: str,
        groups: list[RowGroup],
        rank: int,
        world: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        buffer_row_groups: int = 4,
        with_label: bool = True,
        decode_threads: int = 2,
        layout: FeatureLayout | None = None,
        weighted: bool = False,
        dense: bool = True,
    ):
        self.root = str(root)  # a path or URI (sparkml_dist.storage)
        self.pieces = shard_pieces(groups, rank, world)
        self.rank = rank
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.buffer_row_groups = buffer_row_groups
        self.layout = layout  # None: the files hold a dense `features` list column
        self.dense = dense  # False: batches stay compact (a GPU makes them dense: data.expand)
        self.columns = [
            *feature_columns(layout),
            *(["label"] if with_label else []),
            *(["weight"] if with_label and weighted else []),
        ]
        self._local = threading.local()  # ParquetFile readers are not thread-safe: one set per thread
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loader-prefetch")
        self._decoders = ThreadPoolExecutor(max_workers=decode_threads, thread_name_prefix="loader-decode")

    @property
    def num_rows(self) -> int:
        return sum(p.length for p in self.pieces)

    @property
    def feature_dim(self) -> int:
        """Width of the feature vectors (the layout's, or read from this shard's first row)."""
        if self.layout is not None:
            return self.layout.dim
        if not self.pieces:
            raise DataError(f"{self.root}: rank {self.rank} has no rows; use fewer ranks than rows")
        first = self.pieces[0]
        return len(self._read_piece(Piece(first.file, first.row_group, first.offset, 1))[0][0])

    def prepare(self) -> None:
        """Read one row now. A process's first Parquet read has pyarrow import pandas (about
        0.2 s); done here, before training, it is not counted in the first epoch, nor does it
        keep the other ranks waiting at the first collective."""
        if self.pieces:
            first = self.pieces[0]
            self._read_piece(Piece(first.file, first.row_group, first.offset, 1))

    @property
    def num_batches(self) -> int:
        return -(-self.num_rows // self.batch_size)

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """All of this rank's rows once, in batches; `skip_batches` resumes mid-epoch exactly."""
        permuted = (
            (x, y) if perm is None else (x[perm], y[perm] if y is not None else None)
            for x, y, perm in self.buffers(epoch)
        )
        for x, y in batched(permuted, self.batch_size, skip_batches, np.concatenate):
            yield self._dense(x), y

    def buffers(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        """This rank's rows for `epoch` a shuffle buffer (a few row groups) at a time, compact and
        in the order read, each with the permutation the epoch applies to it (None: no shuffle).
        `epoch` permutes and batches them on the host; a GPU feed ships them as they are and
        permutes on the device (`train.feed`), where a gather costs nothing."""
        rng = np.random.default_rng([self.seed, epoch, self.rank])
        order = rng.permutation(len(self.pieces)) if self.shuffle else np.arange(len(self.pieces))
        groups = [
            [self.pieces[i] for i in order[s : s + self.buffer_row_groups]]
            for s in range(0, len(order), self.buffer_row_groups)
        ]
        # decode the next buffer while this one is consumed (pyarrow releases the GIL)
        pending = self._pool.submit(self._read, groups[0]) if groups else None
        for index in range(len(groups)):
            assert pending is not None  # submitted for every group
            x, y = pending.result()
            pending = self._pool.submit(self._read, groups[index + 1]) if index + 1 < len(groups) else None
            yield x, y, (rng.permutation(len(x)) if self.shuffle else None)

    def _dense(self, x: np.ndarray) -> np.ndarray:
        """A batch as the model reads it: rows are kept compact (`stored_features`) until here
        (and after, with `dense=False`)."""
        return batch_input(x, self.layout) if self.dense else x

    @property
    def batch_width(self) -> int:
        """Floats per row of the batches `epoch` yields: the dense width, or the compact width."""
        return self.feature_dim if self.dense or self.layout is None else self.layout.compact_width

    def _read(self, pieces: list[Piece]) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode the pieces' row groups in parallel and stack them."""
        parts = list(self._decoders.map(self._read_piece, pieces))
        x = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, 0), np.float32)
        y = np.concatenate([p[1] for p in parts]) if parts and parts[0][1] is not None else None
        return x, y

    def _read_piece(self, p: Piece) -> tuple[np.ndarray, np.ndarray | None]:
        try:
            table = (
                self._file(p.file).read_row_group(p.row_group, columns=self.columns).slice(p.offset, p.length)
            )
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"{storage.join(self.root, p.file)}: row group {p.row_group} is unreadable ({exc}); "
                f"re-run the preprocess stage to rewrite the dataset"
            ) from None
        x = stored_features(
            table, self.layout, where=f"{storage.join(self.root, p.file)} row group {p.row_group}"
        )
        if "label" not in self.columns:
            return x, None
        y = np.ones((table.num_rows, 2), np.float32)
        y[:, 0] = table.column("label").to_numpy()
        if "weight" in self.columns:
            y[:, 1] = table.column("weight").to_numpy()
        return x, y

    def _file(self, rel: str) -> pq.ParquetFile:
        files = self._local.__dict__.setdefault("files", {})
        if rel not in files:
            path = storage.join(self.root, rel)
            try:
                files[rel] = pq.ParquetFile(storage.open_input(path))
            except (OSError, pa.ArrowException) as exc:
                raise DataError(
                    f"{path}: not a readable Parquet file ({exc}); re-run the preprocess stage "
                    f"to rewrite the dataset"
                ) from None
        return files[rel]


def batched(
    buffers: Iterable[tuple[Any, Any]], batch_size: int, skip_batches: int, concat: Callable[[list[Any]], Any]
) -> Iterator[tuple[Any, Any]]:
    """Fixed-size batches over consecutive buffers of rows (numpy arrays, or tensors on a device):
    a buffer's remainder is topped up with the next one's head (copying only that batch, not the
    buffer) and the last rows make a short batch. The first `skip_batches` are not yielded (a
    resumed epoch). Targets may be None (rows without labels)."""
    carry_x, carry_y = None, None
    emitted = 0
    for x, y in buffers:
        if carry_x is not None and len(carry_x):
            need = batch_size - len(carry_x)
            head_x = concat([carry_x, x[:need]])
            head_y = concat([carry_y, y[:need]]) if y is not None else None
            x, y = x[need:], (y[need:] if y is not None else None)
            if len(head_x) < batch_size:
                carry_x, carry_y = head_x, head_y
                continue
            if emitted >= skip_batches:
                yield head_x, head_y
            emitted += 1
        full = len(x) // batch_size * batch_size
        for b in range(0, full, batch_size):
            if emitted >= skip_batches:
                yield x[b : b + batch_size], (y[b : b + batch_size] if y is not None else None)
            emitted += 1
        carry_x, carry_y = x[full:], (y[full:] if y is not None else None)
    if carry_x is not None and len(carry_x) and emitted >= skip_batches:
        yield carry_x, carry_y


def feature_columns(layout: FeatureLayout | None) -> list[str]:
    """The columns that hold the features: the layout's, or the one dense `features` column."""
    return layout.columns if layout is not None else ["features"]


def stored_features(table: pa.Table | pa.RecordBatch, layout: FeatureLayout | None, where: str) -> np.ndarray:
    """The rows' features as they are kept between reading and batching: compact ([rows, blocks],
    `FeatureLayout.compact`) with a layout, else the dense `features` column."""
    return layout.compact(table, where) if layout is not None else features_to_numpy(table.column("features"))


def batch_input(x: np.ndarray, layout: FeatureLayout | None) -> np.ndarray:
    """Rows kept by `stored_features` -> the dense float32 [rows, dim] the model reads."""
    return layout.expand(x) if layout is not None else x


def dense_features(table: pa.Table | pa.RecordBatch, layout: FeatureLayout | None, where: str) -> np.ndarray:
    """The float32 [rows, dim] matrix the model reads, from `feature_columns(layout)`."""
    return batch_input(stored_features(table, layout, where), layout)


def features_to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A list<float> Arrow column -> a [rows, dim] float32 array without a Python loop."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows = len(arr)
    if rows == 0:
        return np.empty((0, 0), np.float32)
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(rows, -1)


def read_split(root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole split of a preprocess output in memory as (features [rows, dim], labels), for
    notebooks and checks on small data; training streams with `ShardLoader` instead."""
    layout = FeatureLayout.from_json(Manifest.load(root).feature_layout)
    files = storage.list_files(storage.join(str(root), split), suffix=".parquet")
    table = pa.concat_tables([pq.read_table(storage.open_input(f)) for f in files])
    return dense_features(table, layout, where=f"{root}/{split}"), table.column("label").to_numpy().astype(
        np.float32, copy=False
    )


class FrameShardLoader:
    """The `ShardLoader` interface over a rank's share of the training split as the barrier task
    spilled it (`train.input: dataframe`): no reads from shared storage. The share is decoded
    once (its features kept compact, as `ShardLoader` keeps them, when the splits have a layout),
    then shuffled per epoch like the Parquet path and made dense a batch at a time."""

    def __init__(
        self,
        spill_path: str,
        rank: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        layout: FeatureLayout | None = None,
        weighted: bool = False,
        dense: bool = True,
    ):
        self.path = spill_path
        self.dense = dense
        self.rank = rank
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.layout = layout
        self.weighted = weighted
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None

    def prepare(self) -> None:
        self._arrays()

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The share's features and (label, weight) rows, decoded on first use."""
        if self._x is not None and self._y is not None:
            return self._x, self._y
        if not self.path:
            raise DataError(f"rank {self.rank} was dealt no training rows; use fewer ranks than rows")
        table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()
        x = stored_features(table, self.layout, where=f"rank {self.rank}'s share of the training split")
        y = np.ones((table.num_rows, 2), np.float32)
        y[:, 0] = table.column("label").to_numpy()
        if self.weighted:
            y[:, 1] = table.column("weight").to_numpy()
        self._x, self._y = x, y
        return x, y

    @property
    def num_rows(self) -> int:
        return len(self._arrays()[0])

    @property
    def num_batches(self) -> int:
        return -(-self.num_rows // self.batch_size)

    @property
    def feature_dim(self) -> int:
        if self.layout is not None:
            return self.layout.dim
        return self._arrays()[0].shape[1]

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        x, y = self._arrays()
        rows = len(x)
        order = (
            np.random.default_rng([self.seed, epoch, self.rank]).permutation(rows) if self.shuffle else None
        )
        for index, start in enumerate(range(0, rows, self.batch_size)):
            if index < skip_batches:
                continue
            take = (
                slice(start, start + self.batch_size)
                if order is None
                else order[start : start + self.batch_size]
            )
            yield (batch_input(x[take], self.layout) if self.dense else x[take]), y[take]

    @property
    def batch_width(self) -> int:
        return self.feature_dim if self.dense or self.layout is None else self.layout.compact_width
