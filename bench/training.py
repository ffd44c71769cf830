"""Training speed: our 1-rank training loop (streaming Parquet loader, checkpoint-ready loop)
vs a plain PyTorch loop over in-memory tensors, same model, data, batch size and threads.

    .venv/bin/python -m bench.training [--rows 300000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from bench.common import alternate, entry, record
from bench.loader import DIM, write_dataset

HIDDEN = [256, 256]
BATCH = 256


def ours_epoch_seconds(root: Path, groups, threads: int) -> float:
    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.methods import get_method
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.train.job import TrainJob
    from sparkml_dist.train.loop import train_rank

    ddp = get_method("ddp")
    with tempfile.TemporaryDirectory() as ckpt:
        job = TrainJob(
            str(root),
            tuple(groups),
            tuple(groups[:1]),
            ModelSpec("mlp", DIM, 0.0, tuple(HIDDEN)),
            ddp.config(num_ranks=1, epochs=1, batch_size=BATCH, threads_per_rank=threads, device="cpu"),
            ckpt,
            placement=ddp.placement,
        )
        ctx = RankContext(0, 1, 0, 1, 0, 1, "127.0.0.1", "127.0.0.1", 0)
        record = train_rank(ctx, job).records[0]
    return record.samples / record.samples_per_s


def plain_epoch_seconds(x: torch.Tensor, y: torch.Tensor, threads: int) -> float:
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.spec import ModelSpec

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", DIM, 0.0, tuple(HIDDEN)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    perm = torch.randperm(len(x))
    for i in range(0, len(x), BATCH):
        idx = perm[i : i + BATCH]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    return time.perf_counter() - t0


def main(rows: int = 300_000, threads: int = 2) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows)
        tables = [pq.read_table(root / f"train/part-{f}.parquet") for f in range(4)]
        x = torch.from_numpy(
            np.concatenate([np.stack(t["features"].to_numpy(zero_copy_only=False)) for t in tables]).astype(
                np.float32
            )
        )
        y = torch.from_numpy(np.concatenate([t["label"].to_numpy() for t in tables]).astype(np.float32))
        o, b = alternate(
            lambda: ours_epoch_seconds(root, groups, threads), lambda: plain_epoch_seconds(x, y, threads)
        )
    rows_out = [
        entry(
            "train_1rank_vs_plain_torch",
            o,
            b,
            "s/epoch",
            "lower",
            1.10,
            note=f"{rows:,} rows x {DIM}, MLP {HIDDEN}, batch {BATCH}, {threads} threads",
        )
    ]
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    main(parser.parse_args().rows)
