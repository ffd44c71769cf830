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
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch
from torch import nn

from sparkml_dist.data.loader import ShardLoader
from sparkml_dist.launch.backend import pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.heartbeat import Heartbeat
from sparkml_dist.launch.reports import is_peer_failure
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.weights import state_dict_from_bytes, state_dict_to_bytes
from sparkml_dist.observe.monitor import RankMonitor, RankUsage
from sparkml_dist.observe.steps import CommClock, StepTimes
from sparkml_dist.observe.system import SystemSample
from sparkml_dist.train.adapters import apply_adapters, merge_adapters, trainable
from sparkml_dist.train.checkpoint import load_latest, save_checkpoint
from sparkml_dist.train.faults import inject
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.parallel.checkpoint import load_sharded, save_sharded
from sparkml_dist.train.progress import Progress
from sparkml_dist.tasks.base import Target
from sparkml_dist.train.records import EpochRecord, Evaluation, RankResult, RankStats, RankThroughput
from sparkml_dist.train.strategies import Strategy, local_param_bytes

log = logging.getLogger(__name__)


class PeerLost(RuntimeError):
    """A collective failed or timed out because another rank stopped; names that rank."""


@dataclass
class EpochStats:
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    step_times: list[float] = field(default_factory=list)
    phases: StepTimes = field(default_factory=StepTimes)  # the step breakdown (observe.steps)

    def saved(self) -> dict[str, float]:
        return {"loss_sum": self.loss_sum, "samples": self.samples, "seconds": self.seconds}


@dataclass
class Position:
    epoch: int
    step: int  # batches already done in `epoch`
    stats: EpochStats


def resume_position(ckpt: dict | None, num_batches: int, data_world: int) -> Position:
    if ckpt is None:
        return Position(0, 0, EpochStats())
    if ckpt["step"] == 0:  # an epoch start (what the previous epoch's end is saved as)
        return Position(ckpt["epoch"], 0, EpochStats())
    if ckpt["step"] >= num_batches and ckpt.get("data_world", data_world) == data_world:
        return Position(ckpt["epoch"] + 1, 0, EpochStats())  # an epoch end saved by an older version
    if ckpt.get("data_world", data_world) != data_world:
        # only when no epoch start was kept (`_build_and_restore` prefers one): the epoch restarts
        # from mid-epoch weights, so the samples done before the failure count twice in it
        log.warning("checkpoint at epoch %d batch %d was written with %d data shards, this run has %d and no "
                    "epoch-start checkpoint is left: restarting that epoch", ckpt["epoch"] + 1, ckpt["step"],
                    ckpt["data_world"], data_world)
        return Position(ckpt["epoch"], 0, EpochStats())
    return Position(ckpt["epoch"], ckpt["step"], EpochStats(**ckpt.get("partial", {})))


def train_rank(ctx: RankContext, job: TrainJob) -> RankResult:
    """Train on this rank's shard; return its stats, the epoch records and (rank 0) the final weights."""
    cfg = job.train
    torch.set_num_threads(cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // ctx.local_size))
    torch.manual_seed(cfg.seed)  # every rank builds the same initial weights before any sharding
    device = torch.device(pick_device(ctx, cfg.device))
    strategy = job.placement(cfg, ctx.world_size, ctx.rank)
    if job.observe.step_breakdown:
        strategy.comm_clock = CommClock()  # before wrap(): a DDP comm hook reports to it
    # rank 0 connects to the tracking store while the others build too, not inside an epoch
    sink = job.sink.open() if ctx.is_chief and job.sink is not None else None
    try:
        return _train(ctx, job, strategy, device, sink)
    finally:
        if sink is not None:
            sink.close()


def _told_to_stop(job: TrainJob, strategy: Strategy, verdict: bool | None) -> bool:
    """Rank 0's sink verdict, agreed by every rank (a collective, so only for sinks that may stop)."""
    if job.sink is None or not job.sink.may_stop:
        return False
    return strategy.allreduce_max(1 if verdict else 0) > 0


def _train(ctx: RankContext, job: TrainJob, strategy: Strategy, device: torch.device, sink) -> RankResult:
    cfg = job.train
    model, optimizer, ckpt = _build_and_restore(job, strategy, device)

    train_loader = job.loader("train", strategy.data_rank, strategy.data_world, cfg.batch_size, cfg.seed,
                              partition=ctx.partition, shuffle=True, buffer_row_groups=cfg.shuffle_buffer_row_groups)
    val_loader = job.loader("val", strategy.data_rank, strategy.data_world, 4096, cfg.seed, shuffle=False)
    train_loader.prepare()
    steps_per_epoch = _steps_per_epoch(strategy, train_loader)
    strategy.uneven_shards = _shards_differ(strategy, train_loader)  # join() only where they are
    position = resume_position(ckpt, steps_per_epoch, strategy.data_world)
    history = [EpochRecord.from_json(h) for h in ckpt.get("history", [])] if ckpt is not None else []
    if ckpt is not None and ctx.is_chief:
        log.info("attempt %d resumes at epoch %d, batch %d", job.attempt, position.epoch + 1, position.step)
    progress = Progress(ctx.is_chief, cfg.epochs, steps_per_epoch, ctx.world_size, job.label)
    heartbeat = Heartbeat(ctx.rank, ctx.world_size)

    def checkpoint(epoch: int, step: int, stats: EpochStats) -> None:
        # plain types only: checkpoints load with torch.load(weights_only=True)
        meta = {"epoch": epoch, "step": step, "partial": stats.saved(), "history": [h.to_json() for h in history],
                "data_world": strategy.data_world}
        if strategy.sharded_checkpoints:  # a collective: every rank writes its shards
            save_sharded(job.checkpoint_dir, model, optimizer, meta, epoch, step, cfg.checkpoint_keep, ctx.rank,
                         job.checkpoint_key)
        elif ctx.is_chief:
            save_checkpoint(job.checkpoint_dir, {"model": strategy.unwrap(model).state_dict(),
                                                 "optimizer": optimizer.state_dict(), **meta},
                            epoch, step, cfg.checkpoint_keep)

    loss_fn = job.loss()
    # system samples and energy from here on: what the epochs cost, not the model's start-up
    monitor = RankMonitor(ctx.rank, job.observe.system_metrics_interval_s, job.observe.cpu_watts_per_core,
                          device.index if device.type == "cuda" else None)
    with monitor:
        for epoch in range(position.epoch, cfg.epochs):
            start = position.step if epoch == position.epoch else 0
            stats = position.stats if epoch == position.epoch else EpochStats()
            run = EpochRun(model=model, optimizer=optimizer, loss_fn=loss_fn, loader=train_loader,
                           steps=steps_per_epoch, strategy=strategy, device=device, progress=progress,
                           log_every=cfg.log_every_steps, checkpoint_every=cfg.checkpoint_every_steps,
                           checkpoint=checkpoint, seed=cfg.seed, rank=ctx.rank, clock=strategy.comm_clock,
                           before_step=lambda e, s: inject(job.faults, job.attempt, ctx.rank, e, s),
                           at_collective=heartbeat.beat)
            try:
                stats = run.epoch(epoch, start, stats)
            except Exception as exc:
                if is_peer_failure(exc):  # say which rank stopped, not only that a collective failed
                    raise PeerLost(f"{heartbeat.describe_missing() or 'a peer rank was lost'} ({exc})") from exc
                raise
            record = epoch_record(epoch, stats, strategy, evaluate(model, val_loader, strategy, device, job.target),
                                  cfg.straggler_factor, monitor.epoch_usage())
            history.append(record)
            progress.epoch_end(record)
            verdict = sink(record) if sink is not None else None
            checkpoint(epoch + 1, 0, EpochStats())  # saved as the next epoch's start: valid at any world size
            if _told_to_stop(job, strategy, verdict):
                if ctx.is_chief:
                    log.info("%sstopping after epoch %d: the epoch sink said so (a pruned trial)",
                             progress.prefix, epoch + 1)
                break

    if job.adapt is not None:
        merge_adapters(strategy.unwrap(model))  # the exported model has the base model's names
    weights = strategy.full_state_dict(model)  # a collective under the model-parallel strategies
    pace = [r for h in history[-1:] for r in h.per_rank if r.rank == ctx.rank]
    stats = RankStats(rank=ctx.rank, samples=train_loader.num_rows, steps=steps_per_epoch * cfg.epochs,
                      samples_per_s=pace[0].samples_per_s if pace else 0.0, step_ms=pace[0].step_ms if pace else 0.0,
                      param_bytes=local_param_bytes(model),
                      param_checksum=parameter_checksum(strategy.unwrap(model)) if strategy.replicated else None)
    return RankResult(
        stats=stats,
        records=tuple(history),
        weights=state_dict_to_bytes(weights) if ctx.is_chief else None,
        full_checksum=parameter_checksum_of(weights) if ctx.is_chief else None,
        stragglers=tuple(sorted({r for h in history for r in h.stragglers})),
    )


def _build_and_restore(job: TrainJob, strategy: Strategy, device: torch.device):
    """Model and optimizer placed by the strategy, restored from the newest checkpoint if any.
    A fine-tuning job starts from `init_weights` with its adapters in place."""
    cfg = job.train
    model = build_model(job.model_spec)
    if job.init_weights is not None:
        model.load_state_dict(state_dict_from_bytes(job.init_weights))
    if job.adapt is not None:
        apply_adapters(model, job.adapt)
    model = model.to(device)
    ckpt = None if strategy.sharded_checkpoints else load_latest(job.checkpoint_dir)
    if ckpt is not None and ckpt["step"] > 0 and ckpt.get("data_world", strategy.data_world) != strategy.data_world:
        # relaunched with another number of ranks (elastic): a mid-epoch position means nothing
        # in the new cut of the data; resume at the newest epoch start, so every sample is seen
        # exactly once per epoch (the partial epoch's updates are dropped)
        log.warning("the ranks were %d data shards and are now %d: resuming from the newest epoch start",
                    ckpt["data_world"], strategy.data_world)
        ckpt = load_latest(job.checkpoint_dir, epoch_start=True)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    model, optimizer = strategy.wrap(
        model, lambda params: torch.optim.AdamW(trainable(params), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    )
    if strategy.sharded_checkpoints:
        ckpt = load_sharded(job.checkpoint_dir, model, optimizer, job.checkpoint_key, strategy.data_world)  # reshards to this layout
    elif ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        strategy.broadcast_state(model, optimizer)
    return model, optimizer, ckpt


def _steps_per_epoch(strategy: Strategy, loader: ShardLoader) -> int:
    """Ranks in lockstep all run the longest shard's count (the shorter ones idle-step)."""
    return strategy.allreduce_max(loader.num_batches) if strategy.needs_lockstep else loader.num_batches


def _shards_differ(strategy: Strategy, loader: ShardLoader) -> bool:
    """Whether some rank has fewer batches an epoch than another (a collective: every rank calls it)."""
    return strategy.allreduce_max(loader.num_batches) != -strategy.allreduce_max(-loader.num_batches)


@dataclass
class EpochRun:
    """One epoch of optimizer steps, resumable at any batch."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    loader: ShardLoader
    steps: int  # >= the loader's batches: ranks in lockstep idle-step past their own last batch
    strategy: Strategy
    device: torch.device
    progress: Progress
    log_every: int
    checkpoint_every: int
    checkpoint: Callable[[int, int, EpochStats], None]
    seed: int
    rank: int
    before_step: Callable[[int, int], None]
    at_collective: Callable[[int, int], None]
    clock: CommClock | None = None  # None: no step breakdown (observe.step_breakdown off)

    def epoch(self, epoch: int, start_step: int, stats: EpochStats) -> EpochStats:
        self.model.train()
        accumulate = getattr(self.strategy, "backward_passes_per_step", 1)  # gradient accumulation
        last = self.steps - 1
        started = time.perf_counter() - stats.seconds
        self.optimizer.zero_grad()  # torch 2 default: set_to_none=True (Horovod's override takes no kwargs)
        batches = self.loader.epoch(epoch, skip_batches=start_step)
        idle_batch = None
        with self.strategy.join(self.model):
            t0 = time.perf_counter()
            for step in range(start_step, self.steps):
                batch = next(batches, None)
                self.before_step(epoch, step)
                # same masks on replay; ranks sharing a batch (tensor/pipeline) share the masks
                seed_dropout(self.device, step_seed(self.seed, epoch, step, self.strategy.data_rank))
                if batch is None:  # this shard is done, the others are not: keep the collectives matched
                    # weight 0: a step that changes nothing, with the collectives of a real one
                    idle_batch = idle_batch or self._tensors(np.zeros((1, self.loader.feature_dim), np.float32),
                                                             np.zeros((1, 2), np.float32))
                    self.strategy.idle_step(self.model, *idle_batch, self.loss_fn)
                    loss, rows = None, 0
                else:
                    xb, yb = self._tensors(*batch)
                    data_ready = time.perf_counter()
                    # local time (data) before the first collective: what tells a straggler
                    # apart, since every rank's full step waits for the slowest
                    stats.step_times.append(data_ready - t0)
                    self.at_collective(epoch, step)  # progress mark: this rank joins this batch's collectives
                    loss = self.strategy.train_step(self.model, xb, yb, self.loss_fn, accumulate)
                    backward_done = time.perf_counter()
                    rows = len(xb)
                stepped = (step + 1) % accumulate == 0 or step == last
                if stepped:
                    self.strategy.optimizer_step(self.optimizer)
                    self.optimizer.zero_grad()
                optimizer_done = time.perf_counter()
                loss_value = float(loss) if loss is not None else float("nan")
                if loss is not None:
                    stats.loss_sum += loss_value * rows
                stats.samples += rows
                stats.seconds = time.perf_counter() - started
                self.progress.advance()
                if (step + 1) % self.log_every == 0:
                    self.progress.step(epoch, step, loss_value,
                                       stats.samples * self.strategy.data_world / max(stats.seconds, 1e-9))
                if stepped and self.checkpoint_every and (step + 1) % self.checkpoint_every == 0 and step != last:
                    self.checkpoint(epoch, step + 1, stats)
                end = time.perf_counter()
                if self.clock is not None:
                    comm = self.clock.take()  # every step, idle ones too: the clock starts over
                    if batch is not None:
                        stats.phases.add(t0, data_ready, backward_done, optimizer_done, end, comm)
                t0 = end
        stats.seconds = time.perf_counter() - started
        return stats

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)


def seed_dropout(device: torch.device, seed: int) -> None:
    # not torch.manual_seed: with no GPU initialised it records a stack trace per call (~0.8 ms)
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, step, rank]).generate_state(1)[0])


def epoch_record(epoch: int, stats: EpochStats, strategy: Strategy, evaluation: Evaluation,
                 straggler_factor: float, usage: RankUsage | None = None) -> EpochRecord:
    """The epoch over all ranks (collectives: every rank calls it and gets the same record)."""
    share = strategy.metric_share  # ranks that split one batch count it once
    totals = strategy.allreduce_sum(torch.tensor([stats.loss_sum * share, stats.samples * share, stats.seconds],
                                                 dtype=torch.float64))
    loss_sum, samples, seconds = totals.tolist()
    mean_seconds = seconds / strategy.world_size
    gathered = strategy.allgather_object(rank_usage(strategy, stats, usage or RankUsage()))
    per_rank = tuple(pace for pace, _, _ in gathered)
    methods = sorted({method for _, _, method in gathered if method})
    return EpochRecord(epoch=epoch, train_loss=loss_sum / max(samples, 1), samples=int(round(samples)),
                       samples_per_s=samples / max(mean_seconds, 1e-9), evaluation=evaluation,
                       stragglers=tuple(find_stragglers(per_rank, straggler_factor)), per_rank=per_rank,
                       system=tuple(s for _, samples_, _ in gathered for s in samples_),
                       energy_method=", ".join(methods))


def rank_usage(strategy: Strategy, stats: EpochStats,
               usage: RankUsage) -> tuple[RankThroughput, tuple[SystemSample, ...], str]:
    """This rank's pace, step breakdown, energy and system samples this epoch (what rank 0 gathers)."""
    phases = stats.phases.means_ms()
    if not strategy.comm_measured:  # inside forward/backward, not timed apart: no figure, not a zero
        phases.pop("comm", None)
    pace = RankThroughput(strategy.rank, stats.samples / max(stats.seconds, 1e-9),
                          1000 * float(np.median(stats.step_times or [0.0])), phases,
                          usage.cpu_joules, usage.gpu_joules, usage.cpu_seconds)
    return pace, usage.samples, usage.energy_method


def find_stragglers(per_rank: tuple[RankThroughput, ...], factor: float) -> list[int]:
    """Ranks whose median step time exceeds `factor` x the median over ranks."""
    middle = float(np.median([r.step_ms for r in per_rank]))
    return [r.rank for r in per_rank if middle > 0 and r.step_ms > factor * middle]


@torch.no_grad()
def evaluate(model, loader: ShardLoader, strategy: Strategy, device, target: Target) -> Evaluation:
    """Validation loss and the task's held-out metric over every data shard (sums allreduced)."""
    model.eval()
    task = target.kind
    loss_sum, metric_sum, weight_sum, bins = 0.0, 0.0, 0.0, None
    batches = loader.epoch(0)
    for _ in range(_steps_per_epoch(strategy, loader)):
        batch = next(batches, None)
        if batch is None:  # lockstep: run the collectives of a forward the others are doing
            strategy.logits(model, torch.zeros(1, loader.feature_dim, device=device))
            continue
        xb, yb = torch.from_numpy(batch[0]).to(device), torch.from_numpy(batch[1]).to(device)
        logits = strategy.logits(model, xb)  # DDP: the bare module, no collective per batch
        if logits is None:  # a pipeline stage before the last
            continue
        sums = task.held_out_sums(target, logits, yb)
        loss_sum, metric_sum, weight_sum = loss_sum + sums[0], metric_sum + sums[1], weight_sum + sums[2]
        if task.held_out_extra:  # counted on the host, as the sums above are
            counts = task.held_out_bins(target, logits.detach().cpu(), yb.cpu())
            bins = counts if bins is None else bins + counts
    if task.held_out_extra and bins is None:  # no batch here (a short shard, a pipeline's first stage)
        bins = task.held_out_bins(target, torch.zeros(0), torch.zeros(0, 2))
    share = strategy.metric_share
    sums = torch.tensor([loss_sum, metric_sum, weight_sum], dtype=torch.float64)
    # one allreduce: the sums, then the extra metrics' counts (ranks that split one batch count it once)
    totals = strategy.allreduce_sum(torch.cat([sums, bins]) * share if bins is not None else sums * share)
    evaluation = task.held_out(target, *totals[:3].tolist())
    if bins is None:
        return evaluation
    return replace(evaluation, extra=task.extra_from_bins(target, totals[3:]))


def parameter_checksum(model: nn.Module) -> tuple[float, ...]:
    """Per-parameter sums: equal across ranks when data-parallel training kept them in step."""
    return tuple(float(p.detach().double().sum()) for p in model.parameters())


def parameter_checksum_of(state: dict[str, torch.Tensor]) -> tuple[float, ...]:
    return tuple(float(v.double().sum()) for v in state.values())
