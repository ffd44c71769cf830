"""The rank function for data-parallel training and the loop it runs.

`train_rank(ctx, job)` is what the barrier stage calls; everything it does lives in small
functions here, testable without Spark (world size 1, or 2 processes with gloo).

Resume is exact: a checkpoint records (epoch, batches done in that epoch) and the epoch's
partial sums; the loader replays the same seeded order and skips the done batches, and the
dropout RNG is seeded per (seed, epoch, step, rank), so no sample is skipped or seen twice.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from sparkml_dist.data.loader import ShardLoader
from sparkml_dist.launch.backends import pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.heartbeat import Heartbeat
from sparkml_dist.launch.reports import is_peer_failure
from sparkml_dist.models.factory import build_model
from sparkml_dist.tracking.client import RankTracker
from sparkml_dist.train.checkpoint import load_latest, save_checkpoint, state_dict_to_bytes
from sparkml_dist.train.faults import inject
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.progress import Progress
from sparkml_dist.train.strategies import DataParallel, make_strategy

log = logging.getLogger(__name__)


class PeerLost(RuntimeError):
    """A collective failed or timed out because another rank stopped; names that rank."""


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    step_times: list[float] = field(default_factory=list)

    def saved(self) -> dict[str, float]:
        return {"loss_sum": self.loss_sum, "samples": self.samples, "seconds": self.seconds}


@dataclass
class Position:
    epoch: int
    step: int  # batches already done in `epoch`
    stats: EpochStats


def resume_position(ckpt: dict | None, num_batches: int) -> Position:
    if ckpt is None:
        return Position(0, 0, EpochStats())
    if ckpt["step"] >= num_batches:  # an epoch-end checkpoint
        return Position(ckpt["epoch"] + 1, 0, EpochStats())
    return Position(ckpt["epoch"], ckpt["step"], EpochStats(**ckpt.get("partial", {})))


def train_rank(ctx: RankContext, job: TrainJob) -> dict[str, Any]:
    """Train on this rank's shard; return history, throughput and (rank 0) the final weights."""
    cfg = job.train
    torch.set_num_threads(cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // ctx.local_size))
    torch.manual_seed(cfg.seed)
    device = torch.device(pick_device(ctx, cfg.device))
    strategy = make_strategy(cfg.backend, ctx.world_size, **_strategy_options(cfg))
    model = build_model(job.model_spec).to(device)
    ckpt = load_latest(job.checkpoint_dir)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    model, optimizer = strategy.wrap(
        model, lambda params: torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    )
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        strategy.broadcast_state(model, optimizer)

    train_loader = ShardLoader(job.data_root, list(job.train_groups), ctx.rank, ctx.world_size, cfg.batch_size,
                               cfg.seed, shuffle=True, buffer_row_groups=cfg.shuffle_buffer_row_groups)
    val_loader = ShardLoader(job.data_root, list(job.val_groups), ctx.rank, ctx.world_size, 4096,
                             cfg.seed, shuffle=False)
    position = resume_position(ckpt, train_loader.num_batches)
    history: list[dict[str, float]] = list(ckpt.get("history", [])) if ckpt is not None else []
    if ckpt is not None and ctx.is_chief:
        log.info("attempt %d resumes at epoch %d, batch %d", job.attempt, position.epoch + 1, position.step)
    tracker = RankTracker(job.run, ctx.rank)
    progress = Progress(ctx.is_chief, cfg.epochs, train_loader.num_batches, ctx.world_size)
    stragglers: set[int] = set()
    heartbeat = Heartbeat(ctx.rank, ctx.world_size)

    def checkpoint(epoch: int, step: int, stats: EpochStats) -> None:
        if ctx.is_chief:
            save_checkpoint(job.checkpoint_dir, {
                "model": DataParallel.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch, "step": step, "partial": stats.saved(), "history": history,
            }, epoch, step, cfg.checkpoint_keep)

    for epoch in range(position.epoch, cfg.epochs):
        start = position.step if epoch == position.epoch else 0
        stats = position.stats if epoch == position.epoch else EpochStats()
        run = EpochRun(model, optimizer, nn.BCEWithLogitsLoss(), train_loader, strategy, device, progress,
                       cfg.log_every_steps, cfg.checkpoint_every_steps, checkpoint, cfg.seed, ctx.rank,
                       lambda e, s: inject(job.faults, job.attempt, ctx.rank, e, s), heartbeat.beat)
        try:
            stats = run.epoch(epoch, start, stats)
        except Exception as exc:
            if is_peer_failure(exc):  # say which rank stopped, not only that a collective failed
                raise PeerLost(f"{heartbeat.describe_missing() or 'a peer rank was lost'} ({exc})") from exc
            raise
        metrics = epoch_metrics(stats, strategy) | evaluate(model, val_loader, strategy, device)
        slow = find_stragglers(strategy, stats, cfg.straggler_factor)
        stragglers.update(slow)
        metrics["stragglers"] = float(len(slow))
        history.append({"epoch": epoch, **metrics})
        progress.epoch_end(epoch, metrics, slow)
        tracker.log({"samples_per_s": stats.samples / max(stats.seconds, 1e-9),
                     "step_time_ms": 1000 * float(np.median(stats.step_times or [0.0]))}, epoch, per_rank=True)
        if ctx.is_chief:
            tracker.log(metrics, epoch)
            checkpoint(epoch, train_loader.num_batches, EpochStats())

    final = DataParallel.unwrap(model)
    return {
        "rank": ctx.rank,
        "history": history,
        "samples": train_loader.num_rows,
        "stragglers": sorted(stragglers),
        "param_checksum": parameter_checksum(final),
        "state_dict": state_dict_to_bytes({k: v.cpu() for k, v in final.state_dict().items()}) if ctx.is_chief else None,
    }


def _strategy_options(cfg) -> dict[str, Any]:
    if cfg.backend == "horovod":
        return {"compression": cfg.horovod.compression, "backward_passes_per_step": cfg.horovod.backward_passes_per_step}
    return {}


@dataclass
class EpochRun:
    """One epoch of optimizer steps, resumable at any batch."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    loader: ShardLoader
    strategy: Any
    device: torch.device
    progress: Progress
    log_every: int
    checkpoint_every: int
    checkpoint: Callable[[int, int, EpochStats], None]
    seed: int
    rank: int
    before_step: Callable[[int, int], None]
    at_collective: Callable[[int, int], None]

    def epoch(self, epoch: int, start_step: int, stats: EpochStats) -> EpochStats:
        self.model.train()
        accumulate = getattr(self.strategy, "backward_passes_per_step", 1)  # gradient accumulation
        last = self.loader.num_batches - 1
        started = time.perf_counter() - stats.seconds
        self.optimizer.zero_grad()  # torch 2 default: set_to_none=True (Horovod's override takes no kwargs)
        with self.strategy.join(self.model):
            t0 = time.perf_counter()
            for step, (x, y) in enumerate(self.loader.epoch(epoch, skip_batches=start_step), start=start_step):
                self.before_step(epoch, step)
                seed_dropout(self.device, step_seed(self.seed, epoch, step, self.rank))  # same masks on replay
                xb, yb = torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)
                loss = self.loss_fn(self.model(xb), yb)
                # local time (data + forward) before the collective in backward: what tells a
                # straggler apart, since every rank's full step waits for the slowest
                stats.step_times.append(time.perf_counter() - t0)
                self.at_collective(epoch, step)  # progress mark: this rank joins this batch's allreduce
                (loss / accumulate).backward()
                stepped = (step + 1) % accumulate == 0 or step == last
                if stepped:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                loss_value = float(loss.detach())
                stats.loss_sum += loss_value * len(x)
                stats.samples += len(x)
                stats.seconds = time.perf_counter() - started
                if (step + 1) % self.log_every == 0:
                    self.progress.step(epoch, step, loss_value, stats.samples * self.strategy.world_size / max(stats.seconds, 1e-9))
                if stepped and self.checkpoint_every and (step + 1) % self.checkpoint_every == 0 and step != last:
                    self.checkpoint(epoch, step + 1, stats)
                t0 = time.perf_counter()
        stats.seconds = time.perf_counter() - started
        return stats


def seed_dropout(device: torch.device, seed: int) -> None:
    # not torch.manual_seed: with no GPU initialised it records a stack trace per call (~0.8 ms)
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, step, rank]).generate_state(1)[0])


def epoch_metrics(stats: EpochStats, strategy) -> dict[str, float]:
    totals = strategy.allreduce_sum(torch.tensor([stats.loss_sum, stats.samples, stats.seconds], dtype=torch.float64))
    loss_sum, samples, seconds = totals.tolist()
    mean_seconds = seconds / strategy.world_size
    return {"train_loss": loss_sum / max(samples, 1), "samples": samples,
            "samples_per_s": samples / max(mean_seconds, 1e-9)}


def find_stragglers(strategy, stats: EpochStats, factor: float) -> list[int]:
    """Ranks whose median step time exceeds `factor` x the median over ranks."""
    mine = float(np.median(stats.step_times)) if stats.step_times else 0.0
    per_rank = [v[0] for v in strategy.allgather_floats([mine])]
    middle = float(np.median(per_rank))
    return [r for r, t in enumerate(per_rank) if middle > 0 and t > factor * middle]


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



