"""Streaming, proven by peak memory: a rank training on 1x and 10x the data, and Spark scoring
of 1M and 10M rows. If data streamed, the peak does not grow with the data (ratio ~1). And
against outside baselines, each set up the way its users write it: the same epoch trained by a
plain torch script that reads the Parquet with pandas into a `TensorDataset` and `DataLoader`,
and the same scoring by pyspark's `predict_batch_udf`.

    .venv/bin/python -m bench.memory
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import Measured, entry, in_turn, record

BASE_ROWS = 200_000


def _peak_rss_mib() -> float:
    """This process's own peak RSS. Not getrusage's ru_maxrss: Linux carries that over from the
    parent across fork+exec, so a child of a big process reports the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_train(root: str, rows: int) -> None:
    """Runs in a fresh process: one epoch of one rank over `rows` rows, then print peak RSS."""
    from bench.loader import write_dataset
    from bench.scaling import make_job
    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.train.loop import train_rank

    groups = write_dataset(Path(root), rows, files=8, row_group=8192)
    before = _peak_rss_mib()
    job = make_job(Path(root), groups, 1, hidden=(64,))
    train_rank(RankContext(0, 1, 0, 1, 0, 1, "127.0.0.1", "127.0.0.1", 0), job)
    print(json.dumps({"peak_mib": _peak_rss_mib(), "after_writing_mib": before}))


def child_plain_train(root: str, rows: int) -> None:
    """The baseline in a fresh process: the same files, model and epoch as `child_train`, the way
    a torch user writes it: the Parquet read into one float32 feature matrix and a label vector
    (pyarrow's flattened list column: no array object per row, the frame dropped once read), a
    TensorDataset and a shuffling DataLoader."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from bench.loader import write_dataset
    from bench.scaling import compute_bound
    from sparkml_dist.models.factory import build_model

    write_dataset(Path(root), rows, files=8, row_group=8192)
    before = _peak_rss_mib()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    table = pq.read_table(Path(root) / "train", columns=["features", "label"])
    flat = table.column("features").combine_chunks().flatten().to_numpy()
    x = torch.from_numpy(flat.astype(np.float32, copy=False).reshape(table.num_rows, -1))
    y = torch.from_numpy(table.column("label").to_numpy().astype(np.float32))
    del table, flat
    model = build_model(compute_bound((64,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for xb, yb in torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=1024, shuffle=True
    ):
        optimizer.zero_grad()
        loss_fn(model(xb).squeeze(-1), yb).backward()
        optimizer.step()
    print(json.dumps({"peak_mib": _peak_rss_mib(), "after_writing_mib": before}))


def train_peak(rows: int, kind: str = "child-train") -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-m", "bench.memory", kind, tmp, str(rows)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


class WorkerPeak:
    """Samples the RSS of Spark's Python worker processes (local mode: our descendants) while a
    job runs and keeps the largest one seen."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.peak_mib = 0.0
        self._stop = threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            for child in me.children(recursive=True):
                try:
                    if "pyspark.daemon" in " ".join(child.cmdline()):
                        self.peak_mib = max(self.peak_mib, child.memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            time.sleep(self.interval)


def score_peak(spark, rows: int, scorer: str = "ours") -> float:
    from pyspark.sql import functions as F

    from bench.inference import bundle_for
    from sparkml_dist.inference.udf import score_features

    feats = F.array(*[F.rand(seed=i).cast("float") for i in range(32)]).alias("features")
    df = spark.range(rows, numPartitions=8).select(F.col("id").alias("row_id"), feats)
    bundle = bundle_for([64])
    scored = score_features(df, bundle) if scorer == "ours" else predict_batch_udf_frame(df, bundle)
    with WorkerPeak() as peak:
        scored.write.format("noop").mode("overwrite").save()
    return peak.peak_mib


def predict_batch_udf_frame(df, bundle):
    """The same model through pyspark's `predict_batch_udf`, as its docs set it up: a
    `make_predict_fn` that builds the model once per worker, batches of 1024 rows as numpy."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import FloatType

    spec, weights = bundle.spec, bundle.weights

    def make_predict_fn():
        import torch

        from sparkml_dist.models.factory import build_model
        from sparkml_dist.models.weights import state_dict_from_bytes

        model = build_model(spec)
        model.load_state_dict(state_dict_from_bytes(weights))
        model.eval()

        def predict(x):
            with torch.no_grad():
                return torch.sigmoid(model(torch.from_numpy(x)).squeeze(-1)).numpy()

        return predict

    udf = predict_batch_udf(
        make_predict_fn, return_type=FloatType(), batch_size=1024, input_tensor_shapes=[[32]]
    )
    return df.select("row_id", udf(F.col("features")).alias("probability"))


ROUNDS = 3


def main(spark=None, rounds: int = ROUNDS, parts: tuple[str, ...] = ("train", "score")) -> list[dict]:
    """`rounds` alternated rounds of each comparison (the order reversed every other round); the
    scoring peaks each round in a session of its own, so no round's Python workers have been
    grown by an earlier round's (`spark`, when given, is used for the first round only).
    `parts`: the training rows, the scoring rows, or both."""
    rows_out = train_rows(rounds) if "train" in parts else []
    if "score" in parts:
        rows_out += score_rows(spark, rounds)
    record(rows_out)
    return rows_out


def train_rows(rounds: int) -> list[dict]:
    small: list[float] = []
    big: list[float] = []
    plain: list[float] = []
    for i in range(rounds):
        for kind, peaks in in_turn([("small", small), ("big", big), ("plain", plain)], i):
            rows = BASE_ROWS if kind == "small" else 10 * BASE_ROWS
            peaks.append(train_peak(rows, "child-plain-train" if kind == "plain" else "child-train"))
    rows_out = [
        entry(
            "memory_stream_train",
            Measured(big),
            Measured(small),
            "MiB",
            "lower",
            1.2,
            note=f"peak RSS of a rank training one epoch on {10 * BASE_ROWS:,} vs {BASE_ROWS:,} rows "
            f"(features alone: {10 * BASE_ROWS * 32 * 4 / 2**20:.0f} vs {BASE_ROWS * 32 * 4 / 2**20:.0f} MiB)",
        )
    ]
    rows_out.append(
        entry(
            "memory_train_vs_torch_dataloader",
            Measured(big),
            Measured(plain),
            "MiB",
            "lower",
            1.0,
            note=f"peak RSS of one epoch on {10 * BASE_ROWS:,} rows: our rank vs a torch script that "
            "reads the Parquet into one float32 matrix, a TensorDataset + DataLoader (same model, batch 1024)",
        )
    )
    return rows_out


def score_rows(spark, rounds: int) -> list[dict]:
    one: list[float] = []
    ten: list[float] = []
    theirs: list[float] = []
    for i in range(rounds):
        session = spark if (spark is not None and i == 0) else _session()
        for kind, peaks in in_turn([("one", one), ("ten", ten), ("theirs", theirs)], i):
            peaks.append(
                score_peak(
                    session,
                    1_000_000 if kind == "one" else 10_000_000,
                    "predict_batch_udf" if kind == "theirs" else "ours",
                )
            )
        if session is not spark:
            session.stop()
    rows_out = [
        entry(
            "memory_score_10m",
            Measured(ten),
            Measured(one),
            "MiB",
            "lower",
            1.2,
            note="largest Python worker RSS (sampled) while scoring 10M vs 1M rows x 32 floats",
        ),
        entry(
            "memory_score_vs_predict_batch_udf",
            Measured(ten),
            Measured(theirs),
            "MiB",
            "lower",
            1.0,
            note="largest Python worker RSS (sampled) while scoring 10M rows x 32 floats: ours vs "
            "predict_batch_udf(batch_size=1024) with the same model",
        ),
    ]
    return rows_out


def _session():
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    spark = build_session(SparkConfig(master="local[2]", app_name="bench-memory"))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("child-train", "child-plain-train"):
        (child_train if sys.argv[1] == "child-train" else child_plain_train)(sys.argv[2], int(sys.argv[3]))
    else:
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--part", choices=["train", "score"], action="append", help="default: both")
        main(parts=tuple(parser.parse_args().part or ("train", "score")))
