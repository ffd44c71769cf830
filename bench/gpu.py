"""The GPU check: the project's own training loop and scoring forward on every visible GPU and on
the CPU, beside ceilings measured in the same run. Needs torch, pyarrow, numpy and the package's
pure-Python dependencies (pydantic); no Java, no Spark (a rank's code imports without them).

    make gpu-check                              # or: python -m bench.gpu
    python -m bench.gpu --size small            # the CPU-sized run the tests make
    python -m bench.gpu --record                # also put the target rows into bench/results.json

Each training row runs `train.loop.train_rank` (one rank, in a one-rank process group: NCCL on a
GPU, gloo on the CPU, so the loop's collectives are real calls on the group's device) over a
synthetic Adult-shaped Parquet split: 6 numbers and 8 categories, 100 inputs, the rows stored
compact as the preprocess stage stores them. Its figure is the second epoch's samples/s (the
first holds the warm-up and, with a graph, the capture). The ceilings train the same model with
the same loss and optimizer on batches already dense on the device:
- `bare eager`: the plain PyTorch step (AdamW fused on a GPU);
- `bare graph`: the whole step captured in one CUDA graph, its input copied from device memory;
- `bare graph fed`: the same, the next batch copied from pinned host memory on a side stream into
  one of two input buffers (one graph each) while the other one's graph runs.
Scoring compares `inference.predict.predict` (compact rows in, made dense on the device) with a
bare forward over dense host rows (to the device, forward, back), and checks that both agree
with the CPU to 1e-5. GPU utilisation is NVML's, sampled every 20 ms during each loop row.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sparkml_dist.data.dataset import RowGroup
from sparkml_dist.data.layout import FeatureBlock, FeatureLayout
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.transformer import token_layout
from sparkml_dist.tasks.base import Target
from sparkml_dist.tasks.losses import BinaryLoss
from sparkml_dist.train.precision import Precision

ROOT = Path(__file__).resolve().parents[1]
GPU_RESULTS = ROOT / "bench" / "gpu_results.json"  # the GPU run docs/gpu.md is generated from

# Adult's shape: 6 numbers and 8 categories of these sizes, 100 slots in all
CATEGORIES = (9, 16, 7, 15, 6, 5, 2, 34)
NUMBERS = 6
LAYOUT = FeatureLayout(
    tuple(
        [FeatureBlock(f"n{i}", "value", 1) for i in range(NUMBERS)]
        + [FeatureBlock(f"c{j}", "onehot", size) for j, size in enumerate(CATEGORIES)]
    )
)
NAMES = [f"n{i}" for i in range(NUMBERS)] + [
    f"c{j}__onehot_{v}" for j, s in enumerate(CATEGORIES) for v in range(s)
]
ROW_GROUP = 1 << 16


@dataclass(frozen=True)
class Size:
    rows: int  # training rows written (a run takes as many row groups as its step count needs)
    mlp_steps: int  # steps per epoch a loop row aims at
    transformer_steps: int
    mlp_batches: tuple[int, ...]
    transformer_batches: tuple[int, ...]
    bare_steps: int
    score_rows: int

    def steps(self, kind: str) -> int:
        return self.mlp_steps if kind == "mlp" else self.transformer_steps


SIZES = {
    # a GPU: the batch sizes the issue names, and the bulk of a GPU's batch range
    "gpu": Size(
        rows=8 << 20,
        mlp_steps=200,
        transformer_steps=100,
        mlp_batches=(1024, 4096, 65536),
        transformer_batches=(256, 1024),
        bare_steps=200,
        score_rows=1 << 21,
    ),
    # no GPU (what the tests run): a few steps of each, seconds per row
    "cpu": Size(
        rows=1 << 16,
        mlp_steps=8,
        transformer_steps=4,
        mlp_batches=(4096,),
        transformer_batches=(1024,),
        bare_steps=8,
        score_rows=1 << 14,
    ),
    # make bench's CPU rows: long enough epochs for a ratio
    "cpu-bench": Size(
        rows=1 << 20,
        mlp_steps=120,
        transformer_steps=24,
        mlp_batches=(4096,),
        transformer_batches=(1024,),
        bare_steps=60,
        score_rows=1 << 19,
    ),
}


@dataclass
class Row:
    device: str
    model: str
    batch: int
    precision: str
    graph: str  # loop: off | on; bare ceilings: eager | graph | graph fed
    what: str  # loop | bare eager | bare graph | bare graph fed | scoring | bare forward
    per_s: float
    gpu_util: float | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class Report:
    size: str
    devices: list[str]
    rows: list[Row] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        util = f"  gpu {row.gpu_util:5.1f}%" if row.gpu_util is not None else ""
        print(
            f"{row.device:8s} {row.model:11s} batch {row.batch:6d} {row.precision:4s} {row.what:15s} "
            f"{row.graph:5s} {row.per_s:14,.0f} /s{util} {row.note}",
            flush=True,
        )

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks[name] = ok
        print(f"[{'PASS' if ok else 'FAIL'}] {name} {detail}", flush=True)


# ---- data -------------------------------------------------------------------------------------
def write_split(path: Path, rows: int, seed: int) -> list[RowGroup]:
    """Compact rows (a value per number, an index per category) and a label a linear rule of the
    dense row decides, with noise: a model can learn it, not memorise it."""
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(0).normal(size=LAYOUT.dim).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    groups = []
    for index, start in enumerate(range(0, rows, ROW_GROUP)):
        n = min(ROW_GROUP, rows - start)
        columns = {f"n{i}": rng.normal(size=n).astype(np.float32) for i in range(NUMBERS)}
        columns |= {f"c{j}": rng.integers(0, s, n).astype(np.int32) for j, s in enumerate(CATEGORIES)}
        dense = LAYOUT.expand(np.stack([columns[b.column] for b in LAYOUT.blocks], axis=1).astype(np.float32))
        columns["label"] = ((dense @ weights + rng.normal(size=n)) > 0).astype(np.float32)
        name = f"part-{index:05d}.parquet"
        pq.write_table(pa.table(columns), path / name)
        groups.append(RowGroup(f"{path.name}/{name}", 0, n))
    return groups


def first_groups(groups: list[RowGroup], rows: int) -> tuple[RowGroup, ...]:
    """The split's first `rows` rows (the loader reads a row group's leading rows when told fewer)."""
    taken, total = [], 0
    for group in groups:
        if total >= rows:
            break
        taken.append(RowGroup(group.file, group.index, min(group.rows, rows - total)))
        total += taken[-1].rows
    return tuple(taken)


# ---- models -----------------------------------------------------------------------------------
def spec_of(kind: str) -> ModelSpec:
    if kind == "mlp":
        return ModelSpec("mlp", LAYOUT.dim, dropout=0.1, hidden=(128, 64))
    shape = TransformerShape(tuple(token_layout(NAMES)), d_model=32, heads=4, layers=2, mlp_hidden=64)
    return ModelSpec("transformer", LAYOUT.dim, dropout=0.1, transformer=shape)


# ---- the loop ---------------------------------------------------------------------------------
class Group:
    """A one-rank process group on `device` for the loop's collectives (NCCL on a GPU, gloo on
    the CPU), over an in-process store: nothing listens on the network. A context manager."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)

    def __enter__(self) -> Group:
        import torch.distributed as dist

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
        )
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def run_loop(
    root: Path,
    groups: dict[str, list[RowGroup]],
    device: torch.device,
    method: str,
    kind: str,
    rows: int,
    **options,
):
    """`train_rank` of `method` for one rank over the split's first `rows` rows; `options` are
    `train.*` keys. Returns the rank's result."""
    from sparkml_dist.config.schema import ObserveConfig
    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.methods import get_method
    from sparkml_dist.train.job import TrainJob
    from sparkml_dist.train.loop import train_rank
    from sparkml_dist.train.parallel.signing import checkpoint_key

    entry = get_method(method)
    cfg = entry.config.model_validate(
        {"strategy": method, "num_ranks": 1, "device": device.type, "log_every_steps": 10**9, **options}
    )
    with tempfile.TemporaryDirectory() as checkpoints:
        job = TrainJob(
            data_root=str(root),
            train_groups=first_groups(groups["train"], rows),
            val_groups=tuple(groups["val"]),
            model_spec=spec_of(kind),
            train=cfg,
            checkpoint_dir=checkpoints,
            placement=entry.placement,
            feature_layout=LAYOUT,
            target=Target("binary", ("0", "1")),
            observe=ObserveConfig(system_metrics_interval_s=0),
            checkpoint_key=checkpoint_key(checkpoints),
        )
        ctx = RankContext(
            0,
            1,
            0,
            1,
            0,
            1,
            "127.0.0.1",
            "127.0.0.1",
            0,
            gpus=(str(device.index),) if device.type == "cuda" else (),
        )
        return train_rank(ctx, job)


def loop_row(
    root: Path,
    groups: dict[str, list[RowGroup]],
    device: torch.device,
    kind: str,
    batch: int,
    precision: str,
    graph: str,
    size: Size,
) -> tuple[float, float | None, list[float]]:
    """The loop's samples/s in its second epoch, the GPU's mean utilisation then, and the
    validation loss after each epoch."""
    with Utilisation(device) as util:
        result = run_loop(
            root,
            groups,
            device,
            "ddp",
            kind,
            size.steps(kind) * batch,
            epochs=2,
            batch_size=batch,
            precision=precision,
            cuda_graph=graph,
        )
    return result.records[-1].samples_per_s, util.mean(), [r.evaluation.loss for r in result.records]


class Utilisation:
    """NVML's GPU utilisation, sampled every 20 ms in a thread; the mean over the last epoch."""

    def __init__(self, device: torch.device):
        self.samples: list[tuple[float, float]] = []
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self.nvml = pynvml
        except Exception:
            self.handle = None

    def __enter__(self) -> Utilisation:
        self.stop = threading.Event()
        if self.handle is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.handle is not None:
            self.thread.join()

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            self.samples.append(
                (time.time(), float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            )

    def mean(self) -> float | None:
        if self.handle is None or not self.samples:
            return None
        last = self.samples[-max(1, len(self.samples) // 3) :]  # the last epoch and validation, roughly
        return statistics.mean(v for _, v in last)


# ---- ceilings ---------------------------------------------------------------------------------
def bare_setup(kind: str, device: torch.device, batch: int, precision: str, capturable: bool = False):
    torch.manual_seed(0)
    model = build_model(spec_of(kind)).to(device).train()
    options = {"fused": True, "capturable": capturable} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
    loss_fn = BinaryLoss().to(device)
    prec = Precision(precision, device.type, cache_casts=not capturable)
    xs = [torch.randn(batch, LAYOUT.dim, device=device) for _ in range(4)]
    ys = [torch.stack([(x[:, 0] > 0).float(), torch.ones(batch, device=device)], 1) for x in xs]
    return model, optimizer, loss_fn, prec, xs, ys


def eager_step(model, optimizer, loss_fn, prec, x, y) -> None:
    optimizer.zero_grad()
    with prec.autocast():
        out = model(x)
    prec.backward(loss_fn(out.float(), y))
    prec.step(optimizer)


def synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def bare_eager(kind: str, device: torch.device, batch: int, precision: str, steps: int) -> float:
    model, optimizer, loss_fn, prec, xs, ys = bare_setup(kind, device, batch, precision)
    for i in range(5):
        eager_step(model, optimizer, loss_fn, prec, xs[i % 4], ys[i % 4])
    start = synced(device)
    for i in range(steps):
        eager_step(model, optimizer, loss_fn, prec, xs[i % 4], ys[i % 4])
    return steps * batch / (synced(device) - start)


def captured_step(model, optimizer, loss_fn, prec, static_x, static_y):
    """The whole step in one graph (PyTorch's whole-network capture recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager_step(model, optimizer, loss_fn, prec, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with prec.autocast():
            out = model(static_x)
        loss_fn(out.float(), static_y).backward()
        optimizer.step()
    return graph


def bare_graph(kind: str, device: torch.device, batch: int, precision: str, steps: int) -> float:
    model, optimizer, loss_fn, prec, xs, ys = bare_setup(kind, device, batch, precision, capturable=True)
    static_x, static_y = xs[0].clone(), ys[0].clone()
    graph = captured_step(model, optimizer, loss_fn, prec, static_x, static_y)
    for _ in range(5):
        graph.replay()
    start = synced(device)
    for i in range(steps):
        static_x.copy_(xs[i % 4])
        static_y.copy_(ys[i % 4])
        graph.replay()
    return steps * batch / (synced(device) - start)


def bare_graph_fed(kind: str, device: torch.device, batch: int, precision: str, steps: int) -> float:
    """Two input buffers, a graph each; batch i+1 is copied from pinned memory on a side stream
    into the other buffer while batch i's graph runs."""
    model, optimizer, loss_fn, prec, xs, ys = bare_setup(kind, device, batch, precision, capturable=True)
    host = [(x.cpu().pin_memory(), y.cpu().pin_memory()) for x, y in zip(xs, ys)]
    buffers = [(xs[0].clone(), ys[0].clone()), (xs[1].clone(), ys[1].clone())]
    graphs = [captured_step(model, optimizer, loss_fn, prec, *buffers[0])]
    graphs.append(captured_step(model, optimizer, loss_fn, prec, *buffers[1]))
    copy = torch.cuda.Stream()
    compute = torch.cuda.current_stream()
    done = [torch.cuda.Event(), torch.cuda.Event()]  # buffer b's graph finished: it may be refilled
    loaded = [torch.cuda.Event(), torch.cuda.Event()]
    start = synced(device)
    for i in range(steps):
        b = i % 2
        with torch.cuda.stream(copy):
            copy.wait_event(done[b])
            buffers[b][0].copy_(host[i % 4][0], non_blocking=True)
            buffers[b][1].copy_(host[i % 4][1], non_blocking=True)
            loaded[b].record(copy)
        compute.wait_event(loaded[b])
        graphs[b].replay()
        done[b].record(compute)
    return steps * batch / (synced(device) - start)


# ---- scoring ----------------------------------------------------------------------------------
def scoring_rows(report: Report, device: torch.device, size: Size) -> None:
    from sparkml_dist.inference.predict import network_outputs, predict

    rng = np.random.default_rng(1)
    compact = np.stack(
        [
            rng.normal(size=size.score_rows)
            if b.kind == "value"
            else rng.integers(0, b.size, size.score_rows)
            for b in LAYOUT.blocks
        ],
        axis=1,
    ).astype(np.float32)
    dense = LAYOUT.expand(compact)
    torch.manual_seed(0)
    model = build_model(spec_of("mlp")).eval()
    expected = network_outputs(model, compact, layout=LAYOUT)
    on_device = build_model(spec_of("mlp")).eval().to(device)
    on_device.load_state_dict(model.state_dict())
    target = Target("binary", ("0", "1"))
    got = network_outputs(on_device, compact, layout=LAYOUT)
    report.check(
        f"scoring on {device} = CPU to 1e-5",
        bool(np.allclose(got, expected, rtol=1e-5, atol=1e-5)),
        f"(max difference {float(np.max(np.abs(got - expected))):.2e})",
    )

    def ours() -> float:
        start = synced(device)
        predict(on_device, target, compact, 65536, layout=LAYOUT)
        return size.score_rows / (synced(device) - start)

    @torch.inference_mode()
    def bare() -> float:
        start = synced(device)
        for s in range(0, len(dense), 65536):
            on_device(torch.from_numpy(dense[s : s + 65536]).to(device)).float().cpu()
        return size.score_rows / (synced(device) - start)

    ours(), bare()  # warm-up: the pinned buffer, cuBLAS
    runs = [(ours(), bare()) for _ in range(3)]
    report.add(Row(str(device), "mlp", 65536, "fp32", "-", "scoring", statistics.median(r[0] for r in runs)))
    report.add(
        Row(str(device), "mlp", 65536, "fp32", "-", "bare forward", statistics.median(r[1] for r in runs))
    )


# ---- checks on a GPU --------------------------------------------------------------------------
def graph_dropout_checks(report: Report, device: torch.device) -> None:
    """A captured step's dropout follows the generator's seed set before each replay: the same
    seed gives the same loss, another seed another one (what exact resume relies on)."""
    from sparkml_dist.train.graphed import GraphedStep

    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", LAYOUT.dim, dropout=0.5, hidden=(64,))).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True, capturable=True)
    step = GraphedStep(
        model,
        optimizer,
        1,
        256,
        LAYOUT.dim,
        Precision("fp32", "cuda", cache_casts=False),
        lambda x: x,
        required=True,
    )
    x = torch.randn(256, LAYOUT.dim, device=device)
    y = torch.stack([(x[:, 0] > 0).float(), torch.ones(256, device=device)], 1)
    generator = torch.cuda.default_generators[device.index or 0]
    losses = []
    for seed in (1, 2, 3, 4, 1, 2, 7):
        generator.manual_seed(seed)
        losses.append(float(step.train_step(x, y, BinaryLoss().to(device))))
        step.optimizer_step()
    report.check(
        "graph replays take each step's dropout seed",
        step.captured and losses[4] == losses[0] and losses[5] == losses[1] and len(set(losses[3:])) >= 3,
        f"losses {[round(v, 5) for v in losses]}",
    )


COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "send",
    "recv",
    "isend",
    "irecv",
)


class CollectiveDevices:
    """Records the device of every tensor handed to torch.distributed's collectives while it is
    active (in this process): what `Parallelism.collective_device` promises is checked against it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._saved: dict[str, object] = {}

    def __enter__(self) -> CollectiveDevices:
        import torch.distributed as dist

        for name in COLLECTIVES:
            original = getattr(dist, name)
            self._saved[name] = original
            setattr(dist, name, self._recording(name, original))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        for name, original in self._saved.items():
            setattr(dist, name, original)

    def _recording(self, name: str, original):
        def call(tensor, *args, **kwargs):
            first = tensor[0] if isinstance(tensor, (list, tuple)) and tensor else tensor
            if isinstance(first, torch.Tensor):
                self.seen.append((name, str(first.device)))
            return original(tensor, *args, **kwargs)

        return call

    def off(self, device: torch.device) -> list[tuple[str, str]]:
        """The collectives whose tensors were not on `device`."""
        return [(name, where) for name, where in self.seen if torch.device(where) != device]


def method_checks(report: Report, root: Path, groups, device: torch.device) -> None:
    """ddp, fsdp and tensor parallel through the loop on one rank of an NCCL group: each finishes
    (tensor parallel's first AdamW step included) with every collective on the GPU."""
    for method, kind in (("ddp", "mlp"), ("fsdp", "transformer"), ("tensor", "transformer")):
        with CollectiveDevices() as recorder:
            try:
                method_run(root, groups, device, method, kind)
                problem = ""
            except Exception as exc:
                problem = f"{type(exc).__name__}: {str(exc)[:300]}"
        off = recorder.off(device)
        report.check(
            f"{method} on {device}: trains, every collective on the group's device",
            not problem and not off,
            problem or f"({len(recorder.seen)} collectives, off the device: {off})",
        )


def horovod_checks(report: Report, root: Path, groups, device: torch.device) -> None:
    """Horovod's data parallelism through the loop on one rank (NCCL for a GPU's gradients where
    the build has it), fp32 and, on a GPU, fp16 (its loss scaler around DistributedOptimizer)."""
    try:
        import horovod.torch as hvd
    except ImportError:
        print("horovod: not installed, no row", flush=True)
        return
    hvd.init()
    built = "NCCL" if hvd.nccl_built() else "Gloo only"
    for precision in ("fp32", "fp16") if device.type == "cuda" else ("fp32", "bf16"):
        try:
            losses = method_run(
                root, groups, device, "ddp", "mlp", {"backend": "horovod", "precision": precision}
            )
            problem = "" if losses[-1] < 0.69 else f"val loss {losses[-1]:.4f}"
        except Exception as exc:
            problem = f"{type(exc).__name__}: {str(exc)[:300]}"
        report.check(f"horovod ({built}) {precision} on {device}: trains", not problem, problem)


def method_run(
    root: Path,
    groups,
    device: torch.device,
    method: str,
    kind: str,
    options: dict | None = None,
    rows: int = 20 * 512,
) -> list[float]:
    """One epoch of `method` on about `rows` rows (one rank), checkpointing mid-epoch too; the
    validation loss after each epoch."""
    result = run_loop(
        root,
        groups,
        device,
        method,
        kind,
        rows,
        **{"epochs": 1, "batch_size": 512, "checkpoint_every_steps": 8, **(options or {})},
    )
    return [r.evaluation.loss for r in result.records]


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default=None,
        help="gpu where there is one, else cpu (what the tests run); cpu-bench for make bench",
    )
    parser.add_argument(
        "--devices", default=None, help="comma-separated, e.g. cuda:0,cpu (default: every GPU, then cpu)"
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("GPU_CHECK_OUT", "output/gpu_check.json"),
        help="the report (JSON); bench/gpu_results.json is the GPU run docs/gpu.md shows",
    )
    parser.add_argument(
        "--record", action="store_true", help="also record the target rows in bench/results.json"
    )
    args = parser.parse_args(argv)
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    devices = [torch.device(d) for d in (args.devices.split(",") if args.devices else [*gpus, "cpu"])]
    report = run(devices, args.size)
    write(report, Path(args.out))
    if args.record:
        record_targets(report)
    return report


def run(devices: list[torch.device], size_name: str | None = None) -> Report:
    """Every device's rows at `size_name`, or by default each at its own kind's size (gpu, cpu)."""
    sizes = {d: SIZES[size_name or ("gpu" if d.type == "cuda" else "cpu")] for d in devices}
    report = Report(
        size_name or ", ".join(sorted({("gpu" if d.type == "cuda" else "cpu") for d in devices})),
        [describe(d) for d in devices],
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = max(size.rows for size in sizes.values())
        groups = {
            "train": write_split(root / "train", rows, 1),
            "val": write_split(root / "val", ROW_GROUP // 4, 2),
        }
        for device in devices:
            device_rows(report, root, groups, device, sizes[device])
    return report


def device_rows(report: Report, root: Path, groups, device: torch.device, size: Size) -> None:
    with Group(device):
        for kind, batch, precision in configurations(device, size):
            for graph in ("off", "on") if device.type == "cuda" and precision != "fp16" else ("off",):
                loop_check(report, root, groups, device, kind, batch, precision, graph, size)
            with failure_reported(report, f"{device} {kind} {batch} {precision} ceilings"):
                ceiling_rows(report, device, kind, batch, precision, size)
        with failure_reported(report, f"{device} scoring"):
            scoring_rows(report, device, size)
        method_checks(report, root, groups, device)
        horovod_checks(report, root, groups, device)
        if device.type == "cuda":
            with failure_reported(report, f"{device} graph dropout"):
                graph_dropout_checks(report, device)


def configurations(device: torch.device, size: Size):
    """(model, batch, precision) of every loop row on `device` (fp16 only where its scaler runs: a GPU)."""
    precisions = ("fp32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16")
    for kind, batches in (("mlp", size.mlp_batches), ("transformer", size.transformer_batches)):
        for batch in batches:
            for precision in precisions:
                yield kind, batch, precision


def loop_check(
    report: Report,
    root: Path,
    groups,
    device: torch.device,
    kind: str,
    batch: int,
    precision: str,
    graph: str,
    size: Size,
) -> None:
    name = f"{device} {kind} {batch} {precision} graph {graph}"
    with failure_reported(report, name):
        per_s, util, losses = loop_row(root, groups, device, kind, batch, precision, graph, size)
        report.add(Row(str(device), kind, batch, precision, graph, "loop", per_s, util))
        report.check(
            f"{name}: validation loss falls", losses[-1] < 0.69, f"(val loss {losses[-1]:.4f}; 0.693 guesses)"
        )


@contextlib.contextmanager
def failure_reported(report: Report, name: str):
    """A row that raises is a failed check with its error (the traceback printed), and the run
    goes on to the next row."""
    try:
        yield
    except Exception as exc:
        traceback.print_exc()
        report.check(f"{name}: runs", False, f"{type(exc).__name__}: {str(exc)[:400]}")


def ceiling_rows(
    report: Report, device: torch.device, kind: str, batch: int, precision: str, size: Size
) -> None:
    report.add(
        Row(
            str(device),
            kind,
            batch,
            precision,
            "eager",
            "bare eager",
            bare_eager(kind, device, batch, precision, size.bare_steps),
        )
    )
    if device.type == "cuda" and precision != "fp16":  # fp16's scaler reads the host each step
        report.add(
            Row(
                str(device),
                kind,
                batch,
                precision,
                "graph",
                "bare graph",
                bare_graph(kind, device, batch, precision, size.bare_steps),
            )
        )
        report.add(
            Row(
                str(device),
                kind,
                batch,
                precision,
                "graph",
                "bare graph fed",
                bare_graph_fed(kind, device, batch, precision, size.bare_steps),
            )
        )


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device}: {torch.cuda.get_device_name(device)}"
    return f"cpu: {os.cpu_count()} cores"


def write(report: Report, path: Path) -> None:
    doc = {
        "date": datetime.date.today().isoformat(),
        "size": report.size,
        "devices": report.devices,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rows": [r.as_dict() for r in report.rows],
        "checks": report.checks,
        "ratios": ratios(report),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"report: {path}", flush=True)


def ratios(report: Report) -> list[dict]:
    """The issue's targets: the loop against the bare eager step (every device), the graphed loop
    against the pinned-fed bare graph (GPUs), scoring against the bare forward."""
    found = {(r.device, r.model, r.batch, r.precision, r.what, r.graph): r.per_s for r in report.rows}
    out = []
    for (device, model, batch, precision, what, graph), per_s in found.items():
        if what == "loop" and graph == "off":
            base = found.get((device, model, batch, precision, "bare eager", "eager"))
            out.append(_ratio(device, model, batch, precision, "loop / bare eager", per_s, base, 0.8))
        elif what == "loop" and graph == "on":
            base = found.get((device, model, batch, precision, "bare graph fed", "graph"))
            out.append(
                _ratio(device, model, batch, precision, "graphed loop / bare graph fed", per_s, base, 0.5)
            )
        elif what == "scoring":
            base = found.get((device, model, batch, precision, "bare forward", "-"))
            out.append(_ratio(device, model, batch, precision, "scoring / bare forward", per_s, base, 0.8))
    return [r for r in out if r is not None]


def _ratio(device, model, batch, precision, name, ours, base, target) -> dict | None:
    if not base:
        return None
    return {
        "device": device,
        "model": model,
        "batch": batch,
        "precision": precision,
        "ratio_of": name,
        "ratio": round(ours / base, 3),
        "target": target,
        "met": ours / base >= target,
    }


def record_targets(report: Report) -> None:
    """The loop-vs-bare rows as bench/results.json rows (ours = the loop, baseline = the bare step)."""
    from bench.common import entry, record

    found = {(r.device, r.model, r.batch, r.precision, r.what, r.graph): r.per_s for r in report.rows}
    rows = []
    for r in ratios(report):
        device = r["device"].replace(":", "")
        if r["ratio_of"] != "loop / bare eager" or r["precision"] != "fp32":
            continue
        ours = found[(r["device"], r["model"], r["batch"], "fp32", "loop", "off")]
        base = found[(r["device"], r["model"], r["batch"], "fp32", "bare eager", "eager")]
        rows.append(
            entry(
                f"loop_vs_bare_eager_{device}_{r['model']}_{r['batch']}",
                ours,
                base,
                "samples/s",
                "higher",
                0.8,
                note="bench.gpu: the project's loop (one rank, Parquet, compact rows) "
                "against the bare eager step on data already on the device",
            )
        )
    record(rows)


DOC = ROOT / "docs" / "gpu.md"
BEGIN, END = (
    "<!-- gpu-check table: python -m bench.gpu --write-doc -->",
    "<!-- end of the gpu-check table -->",
)


def markdown(doc: dict) -> str:
    """The GPU run's report as the tables docs/gpu.md shows (generated, never edited by hand)."""
    lines = [
        f"Run on {doc['date']}: {'; '.join(doc['devices'])}; torch {doc['torch']}, CUDA {doc['cuda']} "
        f"(`bench/gpu_results.json`, size `{doc['size']}`).",
        "",
        "| device | model | batch | precision | what | graph | samples or rows /s | GPU util % |",
        "|---|---|---:|---|---|---|---:|---:|",
    ]
    for r in doc["rows"]:
        util = "" if r.get("gpu_util") is None else f"{r['gpu_util']:.0f}"
        lines.append(
            f"| {r['device']} | {r['model']} | {r['batch']} | {r['precision']} | {r['what']} | {r['graph']} | "
            f"{r['per_s']:,.0f} | {util} |"
        )
    lines += [
        "",
        "| device | model | batch | precision | ratio | value | target | met |",
        "|---|---|---:|---|---|---:|---:|---|",
    ]
    for r in doc["ratios"]:
        lines.append(
            f"| {r['device']} | {r['model']} | {r['batch']} | {r['precision']} | {r['ratio_of']} | "
            f"{r['ratio']:.3f} | {r['target']} | {'yes' if r['met'] else '**no**'} |"
        )
    lines += ["", "Checks in the same run:", ""]
    lines += [f"- {'PASS' if ok else '**FAIL**'}: {name}" for name, ok in doc["checks"].items()]
    return "\n".join(lines) + "\n"


def write_doc(results: Path = GPU_RESULTS, doc_path: Path = DOC) -> str:
    """docs/gpu.md with its table regenerated from `results` (between the markers)."""
    text = doc_path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    updated = f"{head}{BEGIN}\n{markdown(json.loads(results.read_text()))}{END}{tail}"
    doc_path.write_text(updated)
    return updated


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-doc"]:
        write_doc()
        print(f"wrote {DOC}")
    else:
        main()
