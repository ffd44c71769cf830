"""The storage seam: everything read or written outside Spark goes through one URI-based store.

Tested here: plain paths and file:// (with Spark writing the same locations), and the
object-store code path (no rename; one upload per object) through an fsspec in-memory file
system registered as a scheme by the test, as a user would register one. s3://, gs://, abfss://
and hdfs:// go through the same code with pyarrow's own file systems; no such server is reachable
from this machine, so they are not exercised here (docs/architecture.md says so).
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkml_dist import storage
from sparkml_dist.errors import StorageError


@pytest.fixture
def memory_root():
    """A `mem://` scheme backed by fsspec's in-memory file system: an object store without rename."""
    import fsspec
    import pyarrow.fs as pafs

    fs = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    storage.register_scheme(
        storage.Scheme("mem", filesystem=lambda uri: (fs, uri.split("://", 1)[1])), replace=True
    )
    yield f"mem://bucket-{uuid.uuid4().hex[:8]}"
    storage.SCHEMES.unregister("mem")


def test_a_plain_path_is_local_and_spark_is_told_the_same_file_explicitly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.absolute("output/adult") == str(tmp_path / "output" / "adult")
    assert storage.absolute("s3://b/k") == "s3://b/k"
    # a bare path would resolve against the cluster's default file system (HDFS on YARN)
    assert storage.spark_path("output/run_date=2026-11-29") == f"file://{tmp_path}/output/run_date=2026-11-29"
    assert storage.local_path(f"file://{tmp_path}/x") == tmp_path / "x"
    assert storage.local_path("dbfs:/mnt/models") == storage.local_path("/dbfs/mnt/models"), (
        "Databricks' FUSE mount"
    )
    assert storage.spark_path("dbfs:/mnt/models") == "dbfs:/mnt/models"
    assert storage.local_path("s3a://bucket/key") is None


def test_an_unknown_scheme_is_refused_with_the_known_ones():
    with pytest.raises(
        StorageError, match=r"no storage for scheme 'ftp://'; known: file, .*s3a.*register_scheme"
    ):
        storage.read_bytes("ftp://host/x")


def test_a_failed_write_leaves_the_previous_file_and_no_partial_one(tmp_path):
    target = str(tmp_path / "train.json")
    storage.write_json(target, {"run_id": "a"})
    with pytest.raises(RuntimeError, match="killed mid-write"), storage.atomic_writer(target) as fh:
        fh.write(b'{"run_id": "b"')
        raise RuntimeError("killed mid-write")
    assert storage.read_json(target) == {"run_id": "a"}
    assert os.listdir(tmp_path) == ["train.json"], "the temporary file is gone"


def test_the_object_store_path_reads_and_writes_whole_objects(memory_root):
    record = storage.join(memory_root, "run", "train.json")
    storage.write_json(record, {"run_id": "r1"})
    assert storage.exists(record) and storage.read_json(record) == {"run_id": "r1"}
    with pytest.raises(RuntimeError), storage.atomic_writer(record) as fh:
        fh.write(b"{ partial")
        raise RuntimeError("failed before the upload")
    assert storage.read_json(record) == {"run_id": "r1"}, "nothing is uploaded until the content is whole"
    storage.write_text(storage.join(memory_root, "run", "_SUCCESS"), "")
    assert storage.list_files(storage.join(memory_root, "run")) == [record], (
        "hidden and _ files are not listed"
    )
    with storage.local_copy(storage.join(memory_root, "run")) as local:
        assert (local / "train.json").read_text().startswith("{")


def test_checkpoints_and_the_rank_loader_work_on_an_object_store(memory_root):
    import torch

    from sparkml_dist.data.dataset import RowGroup
    from sparkml_dist.data.loader import ShardLoader
    from sparkml_dist.train.checkpoint import list_checkpoints, load_latest, save_checkpoint

    ckpt = storage.join(memory_root, "checkpoints")
    for step in (10, 20, 30):
        save_checkpoint(ckpt, {"step": step, "w": torch.ones(2) * step}, 0, step, keep=2)
    assert [storage.name_of(p) for p in list_checkpoints(ckpt)] == [
        "ckpt-e00000-s0000020.pt",
        "ckpt-e00000-s0000030.pt",
    ]
    assert load_latest(ckpt)["step"] == 30

    rows = 100
    table = pa.table(
        {
            "features": pa.array([[float(i), 1.0] for i in range(rows)], pa.list_(pa.float32())),
            "label": pa.array(np.arange(rows) % 2, pa.float32()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=25)
    storage.write_bytes(
        storage.join(memory_root, "data", "train", "part-0.parquet"), sink.getvalue().to_pybytes()
    )
    groups = [RowGroup("train/part-0.parquet", i, 25) for i in range(4)]
    seen = []
    for rank in (0, 1):
        loader = ShardLoader(storage.join(memory_root, "data"), groups, rank, 2, batch_size=16, seed=0)
        seen += [float(v) for x, _ in loader.epoch(0) for v in x[:, 0]]
    assert sorted(seen) == [float(i) for i in range(rows)], "every row once, read through the store"


@pytest.mark.spark
def test_preprocess_and_training_under_a_file_uri_root(spark, tmp_path):
    """output.root given as file:// : Spark writes the splits there and the ranks, the manifest
    and the records are read back through the store."""
    from conftest import ADULT_CONFIG
    from rank_jobs import loop_job
    from test_training import ONE_RANK

    from sparkml_dist.config import load_config
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.stages import preprocess
    from sparkml_dist.train.loop import train_rank

    csv = tmp_path / "adult.csv"
    write_csv(adult_like(spark, 3000, seed=3), str(csv), files=2)
    cfg = load_config(
        ADULT_CONFIG,
        [
            f"data.train_path={csv}",
            f"data.test_path={csv}",
            f"output.root=file://{tmp_path}/out",
            "train.epochs=1",
        ],
    )
    prep = preprocess(spark, cfg)
    assert prep.path == f"file://{tmp_path}/out/preprocess"
    assert (tmp_path / "out" / "preprocess" / "manifest.json").is_file(), (
        "Spark and the store name the same files"
    )
    result = train_rank(ONE_RANK, loop_job(cfg, prep, storage.join(prep.path, "..", "ckpt")))
    assert result.records[0].samples == prep.manifest.splits["train"].rows
