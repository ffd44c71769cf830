"""Run N optimizer steps of one training method's placement on fixed synthetic data and measure
it: the loss per step (for equivalence with one process), per-step time, bytes this rank sent,
peak memory and parameter bytes held. Used by bench/parallel.py and by the tests (equivalence,
memory).

Data: a fixed global batch per step, split across the parallelism's data shards exactly as the
loader would, so N ranks and one process see the same samples per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sparkml_dist.methods import get_method
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.tasks.losses import BinaryLoss
from sparkml_dist.train.parallel.pipeline import PipelineParallel
from sparkml_dist.train.parallelism import Parallelism, local_param_bytes


@dataclass(frozen=True)
class Probe:
    model_spec: ModelSpec
    strategy: str = "ddp"
    steps: int = 8
    global_batch: int = 64
    lr: float = 1e-3
    seed: int = 0
    tensor_parallel: int = 2
    microbatches: int = 4
    schedule: str = "1f1b"
    threads: int = 1


@dataclass(frozen=True)
class ProbeResult:
    rank: int
    losses: list[float]
    step_s: float
    bytes_sent_per_step: float
    peak_rss_mib: float
    param_bytes: int
    full_param_bytes: int
    state_bytes: int
    stage_microbatch_s: float | None


def synthetic_batches(
    spec: ModelSpec, steps: int, global_batch: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    dim = spec.input_dim
    w = rng.normal(size=dim)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(global_batch, dim)).astype(np.float32)
        y = (x @ w + 0.5 * rng.normal(size=global_batch) > 0).astype(np.float32)
        packed = np.stack([y, np.ones_like(y)], axis=1)  # (label, weight), as the loader yields them
        out.append((torch.from_numpy(x), torch.from_numpy(packed)))
    return out


def reference_losses(probe: Probe) -> list[float]:
    """The same steps in one process, no parallelism."""
    torch.manual_seed(probe.seed)
    model = build_model(probe.model_spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=probe.lr)
    parallelism, loss_fn, losses = Parallelism(1), BinaryLoss(), []
    for x, y in synthetic_batches(probe.model_spec, probe.steps, probe.global_batch, probe.seed):
        losses.append(float(parallelism.train_step(model, x, y, loss_fn, 1)))
        optimizer.step()
        optimizer.zero_grad()
    return losses


def placement_config(probe: Probe, world: int):
    """The method's own train config for this probe (its options, this world size)."""
    options = {
        "strategy": probe.strategy,
        "num_ranks": world,
        "batch_size": probe.global_batch // _data_world(probe, world),
    }
    if probe.strategy == "pipeline":
        options["parallel"] = {"microbatches": probe.microbatches, "schedule": probe.schedule}
    elif probe.strategy == "hybrid":
        options["parallel"] = {"tensor_parallel": probe.tensor_parallel}
    elif probe.strategy == "ddp":  # gloo's allreduce: the traffic the formulas describe (not /dev/shm's)
        options["intra_host_allreduce"] = "process_group"
    return get_method(probe.strategy).config.model_validate(options)


def probe_rank(ctx, probe: Probe) -> ProbeResult:
    torch.set_num_threads(probe.threads)
    torch.manual_seed(probe.seed)
    method = get_method(probe.strategy)
    parallelism = method.placement(placement_config(probe, ctx.world_size), ctx.world_size, ctx.rank)
    model = build_model(probe.model_spec)  # the same initial weights as the reference
    full_bytes = local_param_bytes(model)
    model, optimizer = parallelism.wrap(model, lambda params: torch.optim.AdamW(params, lr=probe.lr))
    loss_fn = BinaryLoss()
    losses, times, sent = [], [], []
    _reset_peak_rss()
    for x, y in synthetic_batches(probe.model_spec, probe.steps, probe.global_batch, probe.seed):
        xs, ys = _my_slice(x, parallelism), _my_slice(y, parallelism)
        wchar, t0 = _bytes_written(), time.perf_counter()
        loss = parallelism.train_step(model, xs, ys, loss_fn, 1)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
        sent.append(_bytes_written() - wchar)
        losses.append(_global_mean_loss(parallelism, loss, len(xs)))
    return ProbeResult(
        ctx.rank,
        losses,
        float(np.median(times[1:] or times)),
        float(np.median(sent[1:] or sent)),
        _peak_rss_mib(),
        local_param_bytes(model),
        full_bytes,
        _optimizer_state_bytes(optimizer) + local_param_bytes(model),
        _stage_compute_s(parallelism, model, probe) if isinstance(parallelism, PipelineParallel) else None,
    )


def _data_world(probe: Probe, world: int) -> int:
    return {"tensor": 1, "pipeline": 1, "hybrid": world // probe.tensor_parallel}.get(probe.strategy, world)


def _my_slice(t: torch.Tensor, parallelism: Parallelism) -> torch.Tensor:
    n = len(t)
    return t[
        n * parallelism.data_rank // parallelism.data_world : n
        * (parallelism.data_rank + 1)
        // parallelism.data_world
    ]


def _global_mean_loss(parallelism: Parallelism, loss: torch.Tensor | None, rows: int) -> float:
    share = parallelism.metric_share if loss is not None else 0.0
    value = float(loss) if loss is not None else 0.0
    totals = parallelism.allreduce_sum(
        torch.tensor([value * rows * share, rows * share], dtype=torch.float64)
    )
    return float(totals[0] / totals[1])


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                local = v.to_local() if hasattr(v, "to_local") else v
                total += local.numel() * local.element_size()
    return total


def _stage_compute_s(parallelism, model: nn.Module, probe: Probe) -> float:
    """One micro-batch's forward + backward through this stage alone (no communication)."""
    mb = probe.global_batch // probe.microbatches
    spec = probe.model_spec
    if parallelism.rank == 0:
        inputs = torch.randn(mb, spec.input_dim)
    else:
        inputs = torch.randn(mb, spec.transformer.tokens, spec.transformer.d_model, requires_grad=True)
    timings = []
    for _ in range(5):
        t0 = time.perf_counter()
        model(inputs).float().sum().backward()
        timings.append(time.perf_counter() - t0)
    model.zero_grad()
    return float(np.median(timings))


def _bytes_written() -> int:
    """Bytes this process passed to write()/writev(): gloo's TCP sends (no disk I/O in between)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM, so the peak is this probe's, not an earlier task's
    except OSError:
        pass


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0
