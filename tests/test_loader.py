"""Rank-side loader: shards are disjoint, cover every row, are balanced, and replay exactly."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkml_dist.data.dataset import RowGroup
from sparkml_dist.data.loader import ShardLoader, shard_pieces


@pytest.fixture
def dataset(tmp_path):
    """3 files with uneven row groups; row i has features [i, i] and label i % 2."""
    groups, start = [], 0
    for f, sizes in enumerate([[100, 37], [64, 64, 5], [250]]):
        n = sum(sizes)
        ids = np.arange(start, start + n, dtype=np.float32)
        table = pa.table(
            {
                "features": pa.array([[v, v] for v in ids], pa.list_(pa.float32())),
                "label": pa.array(ids % 2, pa.float32()),
            }
        )
        rel = f"train/part-{f}.parquet"
        (tmp_path / "train").mkdir(exist_ok=True)
        writer = pq.ParquetWriter(tmp_path / rel, table.schema)
        offset = 0
        for size in sizes:
            writer.write_table(table.slice(offset, size), row_group_size=size)
            offset += size
        writer.close()
        meta = pq.ParquetFile(tmp_path / rel).metadata
        groups += [RowGroup(rel, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
        start += n
    return tmp_path, groups, start


def rows_seen(loader, epoch=0, skip=0):
    return [int(v) for x, _ in loader.epoch(epoch, skip) for v in x[:, 0]]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_are_disjoint_covering_and_balanced(dataset, world):
    root, groups, total = dataset
    per_rank = [rows_seen(ShardLoader(root, groups, r, world, 32, seed=1)) for r in range(world)]
    flat = [v for rank in per_rank for v in rank]
    assert sorted(flat) == list(range(total)), "every row exactly once across ranks"
    sizes = [len(rank) for rank in per_rank]
    assert max(sizes) - min(sizes) <= 1


def test_shuffle_is_deterministic_per_epoch_and_differs_between_epochs(dataset):
    root, groups, _ = dataset
    a = ShardLoader(root, groups, 0, 2, 16, seed=7, buffer_row_groups=2)
    b = ShardLoader(root, groups, 0, 2, 16, seed=7, buffer_row_groups=2)
    assert rows_seen(a, 0) == rows_seen(b, 0)
    assert rows_seen(a, 0) != rows_seen(a, 1)
    assert sorted(rows_seen(a, 0)) == sorted(rows_seen(a, 1))


def test_skip_batches_resumes_exactly_where_it_left_off(dataset):
    root, groups, _ = dataset
    loader = ShardLoader(root, groups, 1, 2, 10, seed=3, buffer_row_groups=1)
    batches = list(loader.epoch(2))
    assert len(batches) == loader.num_batches
    resumed = list(loader.epoch(2, skip_batches=5))
    assert [x.tolist() for x, _ in resumed] == [x.tolist() for x, _ in batches[5:]]


def test_labels_travel_with_their_rows(dataset):
    root, groups, _ = dataset
    for x, y in ShardLoader(root, groups, 0, 1, 64, seed=0).epoch(0):
        assert y.shape == (len(x), 2), "a target row is (label, weight)"
        assert np.array_equal(x[:, 0] % 2, y[:, 0]) and (y[:, 1] == 1).all(), (
            "weight 1 without a weight column"
        )


def test_pieces_split_row_groups_at_rank_boundaries():
    groups = [RowGroup("a", 0, 10), RowGroup("a", 1, 10)]
    assert [(p.row_group, p.offset, p.length) for p in shard_pieces(groups, 0, 2)] == [(0, 0, 10)]
    assert [(p.row_group, p.offset, p.length) for p in shard_pieces(groups, 1, 3)] == [(0, 6, 4), (1, 0, 3)]


def test_a_wide_one_hot_layout_is_shuffled_compact_and_made_dense_one_batch_at_a_time(tmp_path):
    """A category with 20,000 values (an airline's tail numbers) is one int column on disk and
    20,000 slots in the model's input. The loaders keep rows compact through the shuffle and the
    spill, so the largest allocation is a batch, not a shuffle buffer of dense row groups
    (4 x 2,048 rows x 20,003 floats = 655 MB); every batch still equals Spark ML's dense rows."""
    import tracemalloc

    from sparkml_dist.data.layout import ONEHOT, VALUE, FeatureBlock, FeatureLayout
    from sparkml_dist.data.loader import FrameShardLoader

    layout = FeatureLayout(
        (
            FeatureBlock("age", VALUE, 1),
            FeatureBlock("tail", ONEHOT, 20_000),
            FeatureBlock("carrier", ONEHOT, 2),
        )
    )
    rows = 16_384
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "age": pa.array(np.arange(rows, dtype=np.float32)),
            "tail": pa.array(rng.integers(0, 20_000, rows, dtype=np.int32)),
            "carrier": pa.array(rng.integers(0, 2, rows, dtype=np.int32)),
            "label": pa.array(np.ones(rows, np.float32)),
        }
    )
    (tmp_path / "train").mkdir()
    pq.write_table(table, tmp_path / "train" / "part-0.parquet", row_group_size=2048)
    groups = [RowGroup("train/part-0.parquet", i, 2048) for i in range(rows // 2048)]
    spill = tmp_path / "rank0.arrow"
    with pa.ipc.new_file(spill, table.schema) as writer:
        writer.write_table(table)
    expected = layout.to_dense(table)
    for loader in (
        ShardLoader(tmp_path, groups, 0, 1, 256, seed=1, layout=layout),
        FrameShardLoader(str(spill), 0, 256, seed=1, layout=layout),
    ):
        loader.prepare()
        tracemalloc.start()
        try:
            seen = sum(len(x) for x, _ in loader.epoch(0))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert seen == rows
        assert peak < 3 * 256 * layout.dim * 4, (
            f"{type(loader).__name__} allocated {peak / 2**20:.0f} MiB at once"
        )
        order = []
        for x, _ in loader.epoch(1):
            np.testing.assert_array_equal(x, expected[x[:, 0].astype(int)], "each row is its own dense row")
            order += x[:, 0].astype(int).tolist()
        assert sorted(order) == list(range(rows)) and order != list(range(rows)), "every row once, shuffled"
