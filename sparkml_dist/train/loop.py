"""The rank function for data-parallel training and the loop it runs.

`train_rank(ctx, job)` is what the barrier stage calls; everything it does lives in small
functions here, testable without Spark (world size 1, or 2 processes with gloo).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from sparkml_dist.data.loader import ShardLoader
from sparkml_dist.launch.backends import pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.models.factory import build_model
from sparkml_dist.tracking.client import RankTracker
from sparkml_dist.train.checkpoint import load_latest, save_checkpoint, state_dict_to_bytes
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.progress import Progress
from sparkml_dist.train.strategies import DataParallel, make_strategy

log = logging.getLogger(__name__)


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    step_times: list[float] = field(default_factory=list)


def train_rank(ctx: RankContext, job: TrainJob) -> dict[str, Any]:
    """Train on this rank's shard; return history, throughput and (rank 0) the final weights."""
    cfg = job.train
    torch.set_num_threads(cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // ctx.local_size))
    torch.manual_seed(cfg.seed)
    device = torch.device(pick_device(ctx, cfg.device))
    strategy = make_strategy(cfg.backend, ctx.world_size, **_strategy_options(cfg))
    model = build_model(job.model_spec).to(device)
    resumed = load_latest(job.checkpoint_dir)
    if resumed is not None:
        model.load_state_dict(resumed["model"])
    model, optimizer = strategy.wrap(
        model, lambda params: torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    )
    if resumed is not None:
        optimizer.load_state_dict(resumed["optimizer"])
        strategy.broadcast_state(model, optimizer)
    start_epoch = resumed["epoch"] + 1 if resumed is not None else 0

    train_loader = ShardLoader(job.data_root, list(job.train_groups), ctx.rank, ctx.world_size, cfg.batch_size,
                               cfg.seed, shuffle=True, buffer_row_groups=cfg.shuffle_buffer_row_groups)
    val_loader = ShardLoader(job.data_root, list(job.val_groups), ctx.rank, ctx.world_size, 4096,
                             cfg.seed, shuffle=False)
    tracker = RankTracker(job.run, ctx.rank)
    progress = Progress(ctx.is_chief, cfg.epochs, train_loader.num_batches, ctx.world_size)
    history: list[dict[str, float]] = list(resumed.get("history", [])) if resumed is not None else []
    loss_fn = nn.BCEWithLogitsLoss()

    for epoch in range(start_epoch, cfg.epochs):
        stats = train_one_epoch(model, optimizer, loss_fn, train_loader, epoch, strategy, device, progress, cfg.log_every_steps)
        metrics = epoch_metrics(stats, strategy, device) | evaluate(model, val_loader, strategy, device)
        history.append({"epoch": epoch, **metrics})
        progress.epoch_end(epoch, metrics)
        tracker.log({"samples_per_s": stats.samples / max(stats.seconds, 1e-9),
                     "step_time_ms": 1000 * float(np.median(stats.step_times or [0.0]))}, epoch, per_rank=True)
        if ctx.is_chief:
            tracker.log(metrics, epoch)
            save_checkpoint(job.checkpoint_dir, {
                "model": DataParallel.unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch, "step": 0, "history": history,
            }, epoch, 0, cfg.checkpoint_keep)

    final = DataParallel.unwrap(model)
    return {
        "rank": ctx.rank,
        "history": history,
        "samples": train_loader.num_rows,
        "param_checksum": parameter_checksum(final),
        "state_dict": state_dict_to_bytes({k: v.cpu() for k, v in final.state_dict().items()}) if ctx.is_chief else None,
    }


def _strategy_options(cfg) -> dict[str, Any]:
    if cfg.backend == "horovod":
        return {"compression": cfg.horovod.compression, "backward_passes_per_step": cfg.horovod.backward_passes_per_step}
    return {}


def train_one_epoch(model, optimizer, loss_fn, loader: ShardLoader, epoch: int, strategy, device,
                    progress: Progress, log_every: int) -> EpochStats:
    model.train()
    stats = EpochStats()
    started = time.perf_counter()
    accumulate = getattr(strategy, "backward_passes_per_step", 1)  # gradient accumulation
    last = loader.num_batches - 1
    optimizer.zero_grad()  # torch 2 default: set_to_none=True (Horovod's override takes no kwargs)
    with strategy.join(model):
        for step, (x, y) in enumerate(loader.epoch(epoch)):
            t0 = time.perf_counter()
            xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
            loss = loss_fn(model(xb), yb)
            (loss / accumulate).backward()
            if (step + 1) % accumulate == 0 or step == last:
                optimizer.step()
                optimizer.zero_grad()  # torch 2 default: set_to_none=True (Horovod's override takes no kwargs)
            stats.step_times.append(time.perf_counter() - t0)
            loss_value = float(loss.detach())
            stats.loss_sum += loss_value * len(x)
            stats.samples += len(x)
            if (step + 1) % log_every == 0:
                elapsed = time.perf_counter() - started
                progress.step(epoch, step, loss_value, stats.samples * strategy.world_size / max(elapsed, 1e-9))
    stats.seconds = time.perf_counter() - started
    return stats


def epoch_metrics(stats: EpochStats, strategy, device) -> dict[str, float]:
    totals = strategy.allreduce_sum(torch.tensor([stats.loss_sum, stats.samples, stats.seconds], dtype=torch.float64))
    loss_sum, samples, seconds = totals.tolist()
    # throughput of the whole job: all samples over the slowest-rank-ish mean time
    mean_seconds = seconds / strategy.world_size
    return {"train_loss": loss_sum / max(samples, 1), "samples_per_s": samples / max(mean_seconds, 1e-9)}


@torch.no_grad()
def evaluate(model, loader: ShardLoader, strategy, device) -> dict[str, float]:
    """Validation loss and accuracy over every rank's shard (sums allreduced)."""
    model.eval()
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    loss_sum, correct, count = 0.0, 0.0, 0.0
    net = DataParallel.unwrap(model)  # forward without DDP hooks: no collective per batch
    for x, y in loader.epoch(0):
        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        logits = net(xb)
        loss_sum += float(loss_fn(logits, yb))
        correct += float(((logits > 0).float() == yb).sum())
        count += len(x)
    totals = strategy.allreduce_sum(torch.tensor([loss_sum, correct, count], dtype=torch.float64)).tolist()
    return {"val_loss": totals[0] / max(totals[2], 1), "val_accuracy": totals[1] / max(totals[2], 1)}


def parameter_checksum(model: nn.Module) -> list[float]:
    """Per-parameter sums: equal across ranks when data-parallel training kept them in step."""
    return [float(p.detach().double().sum()) for p in model.parameters()]
