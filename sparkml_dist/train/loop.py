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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from sparkml_dist.data.expand import DeviceExpander
from sparkml_dist.errors import ConfigError
from sparkml_dist.launch.backend import pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.heartbeat import Heartbeat
from sparkml_dist.launch.reports import is_peer_failure
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.weights import state_dict_from_bytes, state_dict_to_bytes
from sparkml_dist.observe.monitor import RankMonitor, RankUsage
from sparkml_dist.observe.steps import CommClock, StepTimes
from sparkml_dist.observe.system import SystemSample
from sparkml_dist.tasks.base import Target
from sparkml_dist.train.adapters import apply_adapters, merge_adapters, trainable
from sparkml_dist.train.checkpoint import load_latest, save_checkpoint
from sparkml_dist.train.faults import inject
from sparkml_dist.train.feed import BatchSource, CudaFeed, HostFeed, make_feed
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.parallel.checkpoint import load_sharded, save_sharded
from sparkml_dist.train.parallelism import Parallelism, is_sharded, local_param_bytes
from sparkml_dist.train.precision import Precision, matmul_precision
from sparkml_dist.train.progress import Progress
from sparkml_dist.train.records import EpochRecord, Evaluation, RankResult, RankStats, RankThroughput

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
        log.warning(
            "checkpoint at epoch %d batch %d was written with %d data shards, this run has %d and no "
            "epoch-start checkpoint is left: restarting that epoch",
            ckpt["epoch"] + 1,
            ckpt["step"],
            ckpt["data_world"],
            data_world,
        )
        return Position(ckpt["epoch"], 0, EpochStats())
    return Position(ckpt["epoch"], ckpt["step"], EpochStats(**ckpt.get("partial", {})))


def train_rank(ctx: RankContext, job: TrainJob) -> RankResult:
    """Train on this rank's shard; return its stats, the epoch records and (rank 0) the final weights."""
    cfg = job.train
    torch.set_num_threads(cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // ctx.local_size))
    torch.manual_seed(cfg.seed)  # every rank builds the same initial weights before any sharding
    device = torch.device(pick_device(ctx, cfg.device))
    parallelism = place(job, ctx, device)
    # rank 0 connects to the tracking store while the others build too, not inside an epoch
    sink = job.sink.open() if ctx.is_chief and job.sink is not None else None
    try:
        with matmul_precision(device, cfg.tf32):
            return _train(ctx, job, parallelism, device, sink)
    finally:
        if sink is not None:
            sink.close()


def place(job: TrainJob, ctx: RankContext, device: torch.device) -> Parallelism:
    """The method's parallelism for this rank, told (before it wraps the model) where its
    collectives go, the forward's precision, how compact rows become dense on a GPU and, with
    the step breakdown on, the clock its communication reports to."""
    cfg = job.train
    if job.placement is None:
        raise ValueError(f"train.strategy={cfg.strategy}: its rank program places the model itself")
    parallelism = job.placement(cfg, ctx.world_size, ctx.rank)
    parallelism.bind_device(device)
    try:
        parallelism.precision = Precision(cfg.precision, device.type)
    except (
        ValueError
    ) as exc:  # fp16 on a rank that found no GPU (train.device=auto): a relaunch meets it again
        raise ConfigError(f"rank {ctx.rank} on {ctx.host} trains on {device}: {exc}") from None
    if device.type == "cuda":
        parallelism.expand = DeviceExpander(job.feature_layout, device, job.model_spec.input_dim)
    if job.observe.step_breakdown:
        parallelism.comm_clock = CommClock()  # before wrap(): a DDP comm hook reports to it
    return parallelism


def _told_to_stop(job: TrainJob, parallelism: Parallelism, verdict: bool | None) -> bool:
    """Rank 0's sink verdict, agreed by every rank (a collective, so only for sinks that may stop)."""
    if job.sink is None or not job.sink.may_stop:
        return False
    return parallelism.allreduce_max(1 if verdict else 0) > 0


def _train(
    ctx: RankContext, job: TrainJob, parallelism: Parallelism, device: torch.device, sink
) -> RankResult:
    cfg = job.train
    model, optimizer, ckpt = _build_and_restore(job, parallelism, device)

    on_host = device.type != "cuda"  # a GPU reads compact rows and makes them dense itself
    # a GPU leaves the host's cores to decoding: a buffer's row groups decode in parallel
    decode = {} if on_host else {"decode_threads": cfg.shuffle_buffer_row_groups}
    train_loader = job.loader(
        "train",
        parallelism.data_rank,
        parallelism.data_world,
        cfg.batch_size,
        cfg.seed,
        partition=ctx.partition,
        shuffle=True,
        buffer_row_groups=cfg.shuffle_buffer_row_groups,
        dense=on_host,
        **decode,
    )
    val_loader = job.loader(
        "val", parallelism.data_rank, parallelism.data_world, 4096, cfg.seed, shuffle=False, dense=on_host
    )
    train_loader.prepare()
    train_feed, val_feed = make_feed(train_loader, device), make_feed(val_loader, device)
    steps_per_epoch = _steps_per_epoch(parallelism, train_loader)
    parallelism.uneven_shards = _shards_differ(parallelism, train_loader)  # join() only where they are
    position = resume_position(ckpt, steps_per_epoch, parallelism.data_world)
    history = [EpochRecord.from_json(h) for h in ckpt.get("history", [])] if ckpt is not None else []
    if ckpt is not None and ctx.is_chief:
        log.info("attempt %d resumes at epoch %d, batch %d", job.attempt, position.epoch + 1, position.step)
    progress = Progress(ctx.is_chief, cfg.epochs, steps_per_epoch, ctx.world_size, job.label)
    heartbeat = Heartbeat(ctx.rank, ctx.world_size)

    def checkpoint(epoch: int, step: int, stats: EpochStats) -> None:
        # plain types only: checkpoints load with torch.load(weights_only=True)
        meta = {
            "epoch": epoch,
            "step": step,
            "partial": stats.saved(),
            "history": [h.to_json() for h in history],
            "data_world": parallelism.data_world,
        }
        if parallelism.sharded_checkpoints:  # a collective: every rank writes its shards
            save_sharded(
                job.checkpoint_dir,
                model,
                optimizer,
                meta,
                epoch,
                step,
                cfg.checkpoint_keep,
                ctx.rank,
                job.checkpoint_key,
            )
        elif ctx.is_chief:
            save_checkpoint(
                job.checkpoint_dir,
                {
                    "model": parallelism.unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    **meta,
                },
                epoch,
                step,
                cfg.checkpoint_keep,
            )

    loss_fn = job.loss().to(device)
    # system samples and energy from here on: what the epochs cost, not the model's start-up
    monitor = RankMonitor(
        ctx.rank,
        job.observe.system_metrics_interval_s,
        job.observe.cpu_watts_per_core,
        device.index if device.type == "cuda" else None,
    )
    with monitor:
        for epoch in range(position.epoch, cfg.epochs):
            start = position.step if epoch == position.epoch else 0
            stats = position.stats if epoch == position.epoch else EpochStats()
            run = EpochRun(
                model=model,
                optimizer=optimizer,
                loss_fn=loss_fn,
                feed=train_feed,
                steps=steps_per_epoch,
                parallelism=parallelism,
                device=device,
                progress=progress,
                log_every=cfg.log_every_steps,
                checkpoint_every=cfg.checkpoint_every_steps,
                checkpoint=checkpoint,
                seed=cfg.seed,
                rank=ctx.rank,
                clock=parallelism.comm_clock,
                before_step=lambda e, s: inject(job.faults, job.attempt, ctx.rank, e, s),
                at_collective=heartbeat.beat,
            )
            try:
                stats = run.epoch(epoch, start, stats)
            except Exception as exc:
                if is_peer_failure(exc):  # say which rank stopped, not only that a collective failed
                    raise PeerLost(
                        f"{heartbeat.describe_missing() or 'a peer rank was lost'} ({exc})"
                    ) from exc
                raise
            record = epoch_record(
                epoch,
                stats,
                parallelism,
                evaluate(model, val_feed, parallelism, device, job.target),
                cfg.straggler_factor,
                monitor.epoch_usage(),
            )
            history.append(record)
            progress.epoch_end(record)
            verdict = sink(record) if sink is not None else None
            checkpoint(epoch + 1, 0, EpochStats())  # saved as the next epoch's start: valid at any world size
            if _told_to_stop(job, parallelism, verdict):
                if ctx.is_chief:
                    log.info(
                        "%sstopping after epoch %d: the epoch sink said so (a pruned trial)",
                        progress.prefix,
                        epoch + 1,
                    )
                break

    if job.adapt is not None:
        merge_adapters(parallelism.unwrap(model))  # the exported model has the base model's names
    weights = parallelism.full_state_dict(model)  # a collective under the model-parallel placements
    pace = [r for h in history[-1:] for r in h.per_rank if r.rank == ctx.rank]
    rank_stats = RankStats(
        rank=ctx.rank,
        samples=train_loader.num_rows,
        steps=steps_per_epoch * cfg.epochs,
        samples_per_s=pace[0].samples_per_s if pace else 0.0,
        step_ms=pace[0].step_ms if pace else 0.0,
        param_bytes=local_param_bytes(model),
        param_checksum=parameter_checksum(parallelism.unwrap(model)) if parallelism.replicated else None,
    )
    return RankResult(
        stats=rank_stats,
        records=tuple(history),
        weights=state_dict_to_bytes(weights) if ctx.is_chief else None,
        full_checksum=parameter_checksum_of(weights) if ctx.is_chief else None,
        stragglers=tuple(sorted({r for h in history for r in h.stragglers})),
    )


def _build_and_restore(job: TrainJob, parallelism: Parallelism, device: torch.device):
    """Model and optimizer placed by the parallelism, restored from the newest checkpoint if any.
    A fine-tuning job starts from `init_weights` with its adapters in place."""
    cfg = job.train
    model = build_model(job.model_spec)
    if job.init_weights is not None:
        model.load_state_dict(state_dict_from_bytes(job.init_weights))
    if job.adapt is not None:
        apply_adapters(model, job.adapt)
    model = model.to(device)
    ckpt = None if parallelism.sharded_checkpoints else load_latest(job.checkpoint_dir)
    if (
        ckpt is not None
        and ckpt["step"] > 0
        and ckpt.get("data_world", parallelism.data_world) != parallelism.data_world
    ):
        # relaunched with another number of ranks (elastic): a mid-epoch position means nothing
        # in the new cut of the data; resume at the newest epoch start, so every sample is seen
        # exactly once per epoch (the partial epoch's updates are dropped)
        log.warning(
            "the ranks were %d data shards and are now %d: resuming from the newest epoch start",
            ckpt["data_world"],
            parallelism.data_world,
        )
        ckpt = load_latest(job.checkpoint_dir, epoch_start=True)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])

    def adamw(params, **options) -> torch.optim.Optimizer:
        params = trainable(params)
        options = {**parallelism.optimizer_options(params, device), **options}
        return torch.optim.AdamW(
            param_groups(params), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, **options
        )

    model, optimizer = parallelism.wrap(model, adamw)
    if parallelism.sharded_checkpoints:
        ckpt = load_sharded(
            job.checkpoint_dir, model, optimizer, job.checkpoint_key, parallelism.data_world
        )  # reshards to this layout
    elif ckpt is not None:
        load_optimizer_state(optimizer, ckpt["optimizer"])
        parallelism.broadcast_state(model, optimizer)
    return model, optimizer, ckpt


# how an optimizer runs rather than what it computes: this run's own, not a checkpoint's
KERNEL_OPTIONS = ("foreach", "fused", "capturable", "differentiable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state, keeping this run's kernel options: torch's load takes the
    saved groups' options too, and a CPU run's checkpoint would turn a GPU run's fused, capturable
    AdamW (what a captured step needs) back into the plain one."""
    kept = [{k: g[k] for k in KERNEL_OPTIONS if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, options in zip(optimizer.param_groups, kept):
        group.update(options)


def param_groups(params: list[torch.Tensor]) -> list:
    """The parameters, in two groups where tensor parallelism left some as plain tensors beside
    DTensors: AdamW's foreach and fused kernels take one kind at a time (on CUDA a mix fails at
    the first step: 'got mixed torch.Tensor and DTensor')."""
    sharded = [p for p in params if is_sharded(p)]
    plain = [p for p in params if not is_sharded(p)]
    if not sharded or not plain:
        return params
    return [{"params": sharded}, {"params": plain}]


def _steps_per_epoch(parallelism: Parallelism, loader: BatchSource) -> int:
    """Ranks in lockstep all run the longest shard's count (the shorter ones idle-step)."""
    return parallelism.allreduce_max(loader.num_batches) if parallelism.needs_lockstep else loader.num_batches


def _shards_differ(parallelism: Parallelism, loader: BatchSource) -> bool:
    """Whether some rank has fewer batches an epoch than another (a collective: every rank calls it)."""
    return parallelism.allreduce_max(loader.num_batches) != -parallelism.allreduce_max(-loader.num_batches)


@dataclass
class EpochRun:
    """One epoch of optimizer steps, resumable at any batch.

    Nothing in a step reads a value back from the device: the loss is summed on the device and
    read at the progress lines, checkpoints and the epoch's end; on a GPU the step breakdown
    waits for the device only on the steps it times (`StepTimer`)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    feed: HostFeed | CudaFeed
    steps: int  # >= the loader's batches: ranks in lockstep idle-step past their own last batch
    parallelism: Parallelism
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
        accumulate = getattr(self.parallelism, "backward_passes_per_step", 1)  # gradient accumulation
        last = self.steps - 1
        started = time.perf_counter() - stats.seconds
        loss_before = stats.loss_sum  # a resumed epoch's loss so far; this run's adds up on the device
        loss_total = torch.zeros((), dtype=torch.float64, device=self.device)
        expand = (
            self.parallelism.expand
            if self.parallelism.expand is not None and not self.parallelism.takes_compact_input
            else None
        )
        seed_for = DropoutSeeds(self.device, self.seed, epoch, self.parallelism.data_rank)
        timer = StepTimer(self.clock, self.device, self.parallelism)
        self.parallelism.zero_grad(self.optimizer)
        batches = self.feed.epoch(epoch, skip_batches=start_step)
        idle_batch = None
        with self.parallelism.join(self.model):
            t0 = timer.start(start_step)
            for step in range(start_step, self.steps):
                batch = next(batches, None)
                self.before_step(epoch, step)
                # same masks on replay; ranks sharing a batch (tensor/pipeline) share the masks
                seed_for(step)
                if batch is None:  # this shard is done, the others are not: keep the collectives matched
                    # weight 0: a step that changes nothing, with the collectives of a real one
                    idle_batch = idle_batch or self._idle_batch(expand)
                    self.parallelism.idle_step(self.model, *idle_batch, self.loss_fn)
                    loss, rows = None, 0
                else:
                    xb, yb = batch
                    data_ready = timer.mark()
                    # local time (data) before the first collective: what tells a straggler
                    # apart, since every rank's full step waits for the slowest
                    stats.step_times.append(data_ready - t0)
                    self.at_collective(epoch, step)  # progress mark: this rank joins this batch's collectives
                    loss = self.parallelism.train_step(
                        self.model, expand(xb) if expand else xb, yb, self.loss_fn, accumulate
                    )
                    backward_done = timer.mark()
                    rows = len(xb)
                    if loss is not None:
                        loss_total.add_(loss, alpha=rows)
                stepped = (step + 1) % accumulate == 0 or step == last
                if stepped:
                    self.parallelism.optimizer_step(self.optimizer)
                    self.parallelism.zero_grad(self.optimizer)
                optimizer_done = timer.mark()
                stats.samples += rows
                stats.seconds = time.perf_counter() - started
                self.progress.advance()
                if (step + 1) % self.log_every == 0:
                    self.progress.step(
                        epoch,
                        step,
                        float(loss) if loss is not None else float("nan"),
                        stats.samples * self.parallelism.data_world / max(stats.seconds, 1e-9),
                    )
                if (
                    stepped
                    and self.checkpoint_every
                    and (step + 1) % self.checkpoint_every == 0
                    and step != last
                ):
                    stats.loss_sum = loss_before + float(loss_total)
                    self.checkpoint(epoch, step + 1, stats)
                end = timer.mark()
                if batch is not None:
                    timer.record(stats.phases, t0, data_ready, backward_done, optimizer_done, end)
                else:
                    timer.discard()
                t0 = timer.start(step + 1)
        stats.loss_sum = loss_before + float(loss_total)
        stats.seconds = time.perf_counter() - started
        return stats

    def _idle_batch(self, expand) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.feed.zeros()
        return (expand(x) if expand else x), y


class StepTimer:
    """Times the step breakdown's phase boundaries. On CPU every step, as the host sees it. On a
    GPU the host runs ahead of the device, so a boundary means nothing unless the device has
    caught up: one step in `GPU_EVERY` is timed, waiting for the device at each boundary, and
    the others are left to run asynchronously (the breakdown's means are over the timed steps)."""

    GPU_EVERY = 32

    def __init__(self, clock: CommClock | None, device: torch.device, parallelism: Parallelism):
        self.clock = clock
        self.cuda = device.type == "cuda"
        self.parallelism = parallelism
        self.timing = clock is not None and not self.cuda

    def start(self, step: int) -> float:
        """The step's start; decides whether this step is timed."""
        if self.clock is not None and self.cuda:
            self.timing = step % self.GPU_EVERY == 0
            self.parallelism.sync_timing = self.timing
        return self.mark()

    def mark(self) -> float:
        if self.timing and self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def record(
        self,
        phases: StepTimes,
        t0: float,
        data_ready: float,
        backward_done: float,
        optimizer_done: float,
        end: float,
    ) -> None:
        if self.clock is None:
            return
        comm = self.clock.take()  # every step, idle ones too: the clock starts over
        if self.timing:
            phases.add(t0, data_ready, backward_done, optimizer_done, end, comm)

    def discard(self) -> None:
        if self.clock is not None:
            self.clock.take()


class DropoutSeeds:
    """Seeds the dropout generator of the rank's device for each step: same masks on replay,
    ranks that share a batch share the masks. Host work only (no device call): a hash and the
    generator's seed, about a microsecond."""

    def __init__(self, device: torch.device, seed: int, epoch: int, rank: int):
        self.generator = (
            torch.cuda.default_generators[device.index or 0]
            if device.type == "cuda"
            else torch.default_generator
        )
        self.seed, self.epoch, self.rank = seed, epoch, rank

    def __call__(self, step: int) -> None:
        # not torch.manual_seed: with no GPU initialised it records a stack trace per call (~0.8 ms)
        self.generator.manual_seed(step_seed(self.seed, self.epoch, step, self.rank))


MASK64 = (1 << 64) - 1


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """A well-mixed 63-bit seed for (seed, epoch, step, rank): splitmix64 over the four values
    (numpy's SeedSequence did the same job at ~15 us a step, a tenth of a captured GPU step)."""
    state = 0
    for value in (seed, epoch, step, rank):
        state = (state ^ (value & MASK64)) + 0x9E3779B97F4A7C15 & MASK64
        state = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & MASK64
        state ^= state >> 31
    return state >> 1


def epoch_record(
    epoch: int,
    stats: EpochStats,
    parallelism: Parallelism,
    evaluation: Evaluation,
    straggler_factor: float,
    usage: RankUsage | None = None,
) -> EpochRecord:
    """The epoch over all ranks (collectives: every rank calls it and gets the same record)."""
    share = parallelism.metric_share  # ranks that split one batch count it once
    totals = parallelism.allreduce_sum(
        torch.tensor([stats.loss_sum * share, stats.samples * share, stats.seconds], dtype=torch.float64)
    )
    loss_sum, samples, seconds = totals.tolist()
    mean_seconds = seconds / parallelism.world_size
    gathered = parallelism.allgather_object(rank_usage(parallelism, stats, usage or RankUsage()))
    per_rank = tuple(pace for pace, _, _ in gathered)
    methods = sorted({method for _, _, method in gathered if method})
    return EpochRecord(
        epoch=epoch,
        train_loss=loss_sum / max(samples, 1),
        samples=int(round(samples)),  # noqa: RUF046 -- numpy's round keeps numpy's type
        samples_per_s=samples / max(mean_seconds, 1e-9),
        evaluation=evaluation,
        stragglers=tuple(find_stragglers(per_rank, straggler_factor)),
        per_rank=per_rank,
        system=tuple(s for _, samples_, _ in gathered for s in samples_),
        energy_method=", ".join(methods),
    )


def rank_usage(
    parallelism: Parallelism, stats: EpochStats, usage: RankUsage
) -> tuple[RankThroughput, tuple[SystemSample, ...], str]:
    """This rank's pace, step breakdown, energy and system samples this epoch (what rank 0 gathers)."""
    phases = stats.phases.means_ms()
    if not parallelism.comm_measured:  # inside forward/backward, not timed apart: no figure, not a zero
        phases.pop("comm", None)
    pace = RankThroughput(
        parallelism.rank,
        stats.samples / max(stats.seconds, 1e-9),
        1000 * float(np.median(stats.step_times or [0.0])),
        phases,
        usage.cpu_joules,
        usage.gpu_joules,
        usage.cpu_seconds,
    )
    return pace, usage.samples, usage.energy_method


def find_stragglers(per_rank: tuple[RankThroughput, ...], factor: float) -> list[int]:
    """Ranks whose median step time exceeds `factor` x the median over ranks."""
    middle = float(np.median([r.step_ms for r in per_rank]))
    return [r.rank for r in per_rank if middle > 0 and r.step_ms > factor * middle]


@torch.no_grad()
def evaluate(
    model, feed: HostFeed | CudaFeed, parallelism: Parallelism, device, target: Target
) -> Evaluation:
    """Validation loss and the task's held-out metric over every data shard (sums allreduced).
    The sums stay on the device until the one allreduce: no batch waits for the device."""
    model.eval()
    task = target.kind
    sums, bins = torch.zeros(3, dtype=torch.float64, device=device), None
    expand = parallelism.expand
    batches = feed.epoch(0)
    for _ in range(_steps_per_epoch(parallelism, feed.loader)):
        batch = next(batches, None)
        if batch is None:  # lockstep: run the collectives of a forward the others are doing
            x, _ = feed.zeros()
            parallelism.logits(model, expand(x) if expand else x)
            continue
        xb, yb = batch
        logits = parallelism.logits(
            model, expand(xb) if expand else xb
        )  # DDP: the bare module, no collective per batch
        if logits is None:  # a pipeline stage before the last
            continue
        logits = logits.float()
        sums += held_out_sums(task.held_out_sums(target, logits, yb), device)
        if task.held_out_extra:
            counts = task.held_out_bins(target, logits, yb).to(device)
            bins = counts if bins is None else bins + counts
    if task.held_out_extra and bins is None:  # no batch here (a short shard, a pipeline's first stage)
        bins = task.held_out_bins(target, torch.zeros(0, device=device), torch.zeros(0, 2, device=device)).to(
            device
        )
    share = parallelism.metric_share
    # one allreduce: the sums, then the extra metrics' counts (ranks that split one batch count it once)
    totals = parallelism.allreduce_sum(torch.cat([sums, bins]) * share if bins is not None else sums * share)
    totals = totals.cpu()
    evaluation = task.held_out(target, *totals[:3].tolist())
    if bins is None:
        return evaluation
    return replace(evaluation, extra=task.extra_from_bins(target, totals[3:]))


def held_out_sums(sums, device: torch.device) -> torch.Tensor:
    """A task's three held-out sums as a float64 tensor on `device` (the built-in tasks return a
    tensor there already; a task of one's own may return floats)."""
    if isinstance(sums, torch.Tensor):
        return sums.to(device=device, dtype=torch.float64)
    return torch.tensor([float(v) for v in sums], dtype=torch.float64, device=device)


def parameter_checksum(model: nn.Module) -> tuple[float, ...]:
    """Per-parameter sums: equal across ranks when data-parallel training kept them in step."""
    return tuple(float(p.detach().double().sum()) for p in model.parameters())


def parameter_checksum_of(state: dict[str, torch.Tensor]) -> tuple[float, ...]:
    return tuple(float(v.double().sum()) for v in state.values())
