"""Parameter servers and asynchronous SGD.

Ranks 0..S-1 are servers: each holds a shard of the parameters (split by name) and its own
optimizer. The other ranks are workers: each reads its own shard of the data and loops
pull (parameters + their version) -> forward/backward -> push (gradients + the version they
were computed on), with no barrier between workers within an epoch. A server applies a push at once, unless it
is stale (`version now - version seen > max_staleness`): then it is dropped or scaled by
1/(1+staleness), and counted. A slow worker therefore only makes its own updates older.
At each epoch end all ranks meet once: rank 0 gathers the shards and checkpoints them, and a
relaunch resumes every rank from the newest such checkpoint.

Pulls and pushes travel over `ps_wire`: each server listens on its task's address and admits
only peers that prove the launch's secret; tensors travel as raw bytes, never pickled (torch
RPC would unpickle whatever reaches its port). The servers' addresses reach the workers through
the process group that the launcher's authenticated rendezvous set up.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from sparkml_dist.launch.context import RankContext
from sparkml_dist.methods.async_ps.config import AsyncConfig
from sparkml_dist.methods.async_ps.wire import ServerConnection, ServerEndpoint, layout_of
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.weights import state_dict_to_bytes
from sparkml_dist.observe.monitor import RankMonitor
from sparkml_dist.observe.steps import StepTimes
from sparkml_dist.train.checkpoint import load_latest, save_checkpoint
from sparkml_dist.train.faults import inject
from sparkml_dist.train.feed import HostFeed
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.loop import evaluate
from sparkml_dist.train.parallelism import Parallelism, local_param_bytes
from sparkml_dist.train.precision import Precision
from sparkml_dist.train.records import EpochRecord, Evaluation, RankResult, RankStats, RankThroughput

log = logging.getLogger(__name__)


@dataclass
class ServerStats:
    applied: int = 0
    dropped: int = 0
    downweighted: int = 0
    staleness: list[int] = field(default_factory=list)


class ParameterServer:
    def __init__(
        self, params: dict[str, torch.Tensor], lr: float, weight_decay: float, max_staleness: int, policy: str
    ):
        self.params = {k: nn.Parameter(v.detach().clone()) for k, v in params.items()}
        self.optimizer = torch.optim.AdamW(self.params.values(), lr=lr, weight_decay=weight_decay)
        self.max_staleness = max_staleness
        self.policy = policy
        self.version = 0
        self.stats = ServerStats()
        self.lock = threading.Lock()

    def layout(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return layout_of(self.params)

    def pull(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self.lock:
            return self.version, {k: p.detach().clone() for k, p in self.params.items()}

    def push(self, grads: dict[str, torch.Tensor], seen: int) -> bool:
        with self.lock:
            staleness = self.version - seen
            self.stats.staleness.append(staleness)
            scale = 1.0
            if staleness > self.max_staleness:
                if self.policy == "drop":
                    self.stats.dropped += 1
                    return False
                scale = 1.0 / (1 + staleness)
                self.stats.downweighted += 1
            for k, g in grads.items():
                self.params[k].grad = g * scale
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.version += 1
            self.stats.applied += 1
            return True


def shard_names(names: list[str], servers: int) -> list[list[str]]:
    """Parameter names per server, round-robin in model order."""
    return [names[s::servers] for s in range(servers)]


def async_config(job: TrainJob) -> AsyncConfig:
    """The job's train section, which train.strategy=async validated as an AsyncConfig."""
    if not isinstance(job.train, AsyncConfig):
        raise TypeError(f"the async rank program runs train.strategy=async, not {job.train.strategy}")
    return job.train


def async_rank(ctx: RankContext, job: TrainJob) -> RankResult:
    """The rank function for train.strategy=async (the process group is already up: gloo)."""
    cfg = async_config(job)
    servers = cfg.async_ps.servers
    torch.set_num_threads(cfg.threads_per_rank or 1)
    torch.manual_seed(cfg.seed)
    model = build_model(job.model_spec)
    start_epoch = _resume(job, model)
    shards = shard_names([n for n, _ in model.named_parameters()], servers)
    times = StepTimes()
    with RankMonitor(
        ctx.rank, job.observe.system_metrics_interval_s, job.observe.cpu_watts_per_core
    ) as monitor:
        if ctx.rank < servers:
            result = _serve(ctx, job, model, shards[ctx.rank], start_epoch)
        else:
            result = _work(ctx, job, model, shards, start_epoch, times)
        usage = monitor.epoch_usage()  # the whole run: async has no epochs that all ranks share
    pace = RankThroughput(
        ctx.rank,
        result.stats.samples_per_s,
        result.stats.step_ms,
        times.means_ms() if job.observe.step_breakdown else {},
        usage.cpu_joules,
        usage.gpu_joules,
        usage.cpu_seconds,
    )
    return replace(result, pace=pace, system=usage.samples, energy_method=usage.energy_method)


def _resume(job: TrainJob, model: nn.Module) -> int:
    """Every rank reads the newest epoch checkpoint (shared storage) the same way; the epoch to start at."""
    state = load_latest(job.checkpoint_dir) if job.checkpoint_dir else None
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    log.info("resuming the parameter servers from the checkpoint of epoch %d", state["epoch"])
    return int(state["epoch"]) + 1


def _epoch_end(
    ctx: RankContext, job: TrainJob, model: nn.Module, params: dict | None, epoch: int | None
) -> None:
    """Every rank: the servers' shards gathered into `model`; rank 0 (a server) checkpoints `epoch`."""
    shards: list[dict | None] = [None] * ctx.world_size
    dist.all_gather_object(shards, params)
    model.load_state_dict({k: v for shard in shards if shard for k, v in shard.items()}, strict=False)
    if ctx.rank == 0 and epoch is not None and job.checkpoint_dir:
        state = {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "epoch": epoch}
        save_checkpoint(job.checkpoint_dir, state, epoch, 0, job.train.checkpoint_keep)


def _server_addresses(address: tuple[str, int] | None) -> list[tuple[str, int]]:
    """Every rank: the servers' listening addresses, in server order (a meeting point as well)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, address)
    return [tuple(a) for a in gathered if a is not None]


def _serve(
    ctx: RankContext, job: TrainJob, model: nn.Module, names: list[str], start_epoch: int
) -> RankResult:
    cfg = async_config(job)
    state = dict(model.named_parameters())
    server = ParameterServer(
        {n: state[n] for n in names},
        cfg.learning_rate,
        cfg.weight_decay,
        cfg.async_ps.max_staleness,
        cfg.async_ps.stale_policy,
    )
    endpoint = ServerEndpoint(ctx.host, ctx.secret, server, f"parameter server (rank {ctx.rank})")
    try:
        _server_addresses(endpoint.address)  # servers are up
        for epoch in range(start_epoch, cfg.epochs):
            dist.barrier()  # every worker finished this epoch: its pushes are applied
            _epoch_end(ctx, job, model, server.pull()[1], epoch)
        if start_epoch >= cfg.epochs:  # resumed after the last epoch: only the final parameters
            _epoch_end(ctx, job, model, server.pull()[1], None)
    finally:
        endpoint.close()
    stats, server_params = server.stats, server.params
    counters = {
        "applied": stats.applied,
        "dropped": stats.dropped,
        "downweighted": stats.downweighted,
        **_staleness_summary(stats.staleness),
    }
    held = sum(v.numel() * v.element_size() for v in server_params.values())
    rank_stats = RankStats(rank=ctx.rank, role="server", steps=stats.applied, param_bytes=held)
    if ctx.rank != 0:
        return RankResult(rank_stats, counters=counters)
    evaluation, weights = _final(job, model)
    return RankResult(
        rank_stats,
        records=(EpochRecord(job.train.epochs - 1, float("nan"), 0, 0.0, evaluation),),
        weights=weights,
        counters=counters,
    )


def _work(
    ctx: RankContext,
    job: TrainJob,
    model: nn.Module,
    shards: list[list[str]],
    start_epoch: int,
    times: StepTimes,
) -> RankResult:
    cfg = job.train
    connections = [
        ServerConnection.open(address, ctx.secret, cfg.timeout_s) for address in _server_addresses(None)
    ]
    try:
        return _work_connected(ctx, job, model, shards, start_epoch, connections, times)
    finally:
        for connection in connections:
            connection.close()


def _work_connected(
    ctx: RankContext,
    job: TrainJob,
    model: nn.Module,
    shards: list[list[str]],
    start_epoch: int,
    connections: list[ServerConnection],
    times: StepTimes,
) -> RankResult:
    """Pull, compute, push, step after step; `times` gets each step's breakdown: data, the pull and
    the push (comm, timed as such), forward+backward (compute); the servers run the optimizer."""
    cfg = async_config(job)
    servers = cfg.async_ps.servers
    worker, workers = ctx.rank - servers, ctx.world_size - servers
    loader = job.loader("train", worker, workers, cfg.batch_size, cfg.seed)
    loss_fn, params = job.loss(), dict(model.named_parameters())
    precision = Precision(cfg.precision, "cpu")  # workers train on CPU: fp32 or bf16
    holds = [layout_of({k: params[k] for k in shard}) for shard in shards]
    steps, samples, loss_sum, start = 0, 0, 0.0, time.perf_counter()
    step_times = []
    for epoch in range(start_epoch, cfg.epochs):
        mark = time.perf_counter()
        for step, (x, y) in enumerate(loader.epoch(epoch)):
            t0 = time.perf_counter()
            inject(job.faults, job.attempt, ctx.rank, epoch, step)
            pull_start = time.perf_counter()
            for connection in connections:  # ask every server first: they answer in parallel
                connection.send_pull()
            seen = []
            with torch.no_grad():
                for connection, shard in zip(connections, holds):
                    version, values = connection.recv_pull(shard)
                    seen.append(version)
                    for k, v in values.items():
                        params[k].copy_(v)
            pulled = time.perf_counter()
            model.zero_grad()
            with precision.autocast():
                outputs = model(torch.from_numpy(x))
            loss = loss_fn(outputs.float(), torch.from_numpy(y))
            loss.backward()
            push_start = time.perf_counter()
            for s, connection in enumerate(connections):
                # backward() just gave every parameter its gradient
                connection.send_push({k: cast(torch.Tensor, params[k].grad) for k in shards[s]}, seen[s])
            for connection in connections:
                connection.recv_push()
            pushed = time.perf_counter()
            steps, samples, loss_sum = steps + 1, samples + len(x), loss_sum + float(loss) * len(x)
            step_times.append(time.perf_counter() - t0)
            end = time.perf_counter()
            times.add(mark, t0, pushed, pushed, end, [(pull_start, pulled), (push_start, pushed)])
            mark = end
        dist.barrier()  # this worker finished the epoch
        _epoch_end(ctx, job, model, None, epoch)  # the servers gather (and checkpoint) their shards
    if start_epoch >= cfg.epochs:
        _epoch_end(ctx, job, model, None, None)
    seconds = time.perf_counter() - start
    stats = RankStats(
        rank=ctx.rank,
        role="worker",
        samples=samples // max(cfg.epochs - start_epoch, 1),
        steps=steps,
        samples_per_s=samples / max(seconds, 1e-9),
        step_ms=1000 * float(np.median(step_times)) if step_times else 0.0,
        param_bytes=local_param_bytes(model),
        train_loss=loss_sum / max(samples, 1),
    )
    return RankResult(stats)


def _final(job: TrainJob, model: nn.Module) -> tuple[Evaluation, bytes]:
    """Rank 0: validation of the final parameters over all validation rows (the loop's own
    evaluation, as one process), and the weights to log."""
    loader = job.loader("val", 0, 1, 4096, job.train.seed, shuffle=False)
    evaluation = evaluate(model, HostFeed(loader), Parallelism(1), torch.device("cpu"), job.target)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return evaluation, state_dict_to_bytes(state)


def _staleness_summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"staleness_mean": 0.0, "staleness_p95": 0.0, "staleness_max": 0.0}
    arr = np.asarray(values)
    return {
        "staleness_mean": float(arr.mean()),
        "staleness_p95": float(np.percentile(arr, 95)),
        "staleness_max": float(arr.max()),
    }
