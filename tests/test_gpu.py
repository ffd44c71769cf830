"""The GPU path, tested wherever the tests run: every property is checked on the CPU here, and on
each visible GPU as well where there is one (`python -m pytest tests/test_gpu.py` on a GPU
machine; docs/gpu.md has that run's output). Collectives carry tensors on the device their
group's backend takes; precision and graph settings that cannot work are refused by name; tensor
parallelism's optimizer step takes DTensors and tensors apart; pipelines refuse one rank; rank
code imports without pyspark; scoring on a device gives the CPU's outputs; `make gpu-check` runs."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.gpu import LAYOUT, CollectiveDevices, Group, method_run, spec_of, write_split
from sparkml_dist.config.loader import load_config
from sparkml_dist.errors import ConfigError
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.train.loop import train_rank
from sparkml_dist.train.parallelism import group_device

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ["cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """bench.gpu's Adult-shaped split: 100 inputs stored compact, 16k training rows."""
    root = tmp_path_factory.mktemp("synthetic")
    return root, {
        "train": write_split(root / "train", 1 << 14, 1),
        "val": write_split(root / "val", 1 << 11, 2),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,kind", [("ddp", "mlp"), ("fsdp", "transformer"), ("tensor", "transformer")])
def test_one_rank_collectives_are_on_the_groups_device_and_it_learns(synthetic, device, method, kind):
    root, groups = synthetic
    with Group(device), CollectiveDevices() as recorder:
        losses = method_run(root, groups, torch.device(device), method, kind, rows=4096)
        declared = group_device(torch.device(device))
    assert recorder.seen, "the loop issued its collectives (a one-rank group still runs them)"
    assert recorder.off(declared) == [], f"collectives off {declared}"
    assert losses[-1] < 0.6931, (
        f"{method} learns from one epoch (validation loss {losses[-1]:.4f}; ln 2 guesses)"
    )


def test_the_recorder_names_a_collective_issued_off_the_declared_device():
    """The check above can fail: a tensor on another device is recorded as off it."""
    import torch.distributed as dist

    with Group("cpu"), CollectiveDevices() as recorder:
        dist.all_reduce(torch.ones(2))
        with contextlib.suppress(Exception):  # gloo may refuse it or not: recorded either way
            dist.all_reduce(torch.ones(2, device="meta"))
    assert recorder.off(torch.device("cpu")) == [("all_reduce", "meta")]


def recorded_rank(ctx, job):
    """train_rank with every collective's device recorded, and the device the group declares."""
    with CollectiveDevices() as recorder:
        result = train_rank(ctx, job)
        declared = str(group_device(torch.device("cpu")))
    return recorder.seen, declared, result.records[-1].evaluation.value


@pytest.mark.spark
@pytest.mark.parametrize("overrides", [("intra_host_allreduce=process_group",), ("strategy=fsdp",)], ids=str)
def test_two_rank_collectives_are_on_the_groups_device(spark, adult_prep, tmp_path, overrides):
    from test_training import job_for

    from sparkml_dist.launch import TorchBackend, run_barrier

    cfg, prep = adult_prep
    job = job_for(cfg, prep, tmp_path / "ckpt", "epochs=1", *overrides)
    for seen, declared, accuracy in run_barrier(
        spark, recorded_rank, job, 2, TorchBackend(timeout_s=120, needs_fresh_process=True)
    ):
        assert seen and all(where == declared for _, where in seen), seen
        assert accuracy > 0.8


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_parallel_optimizer_steps_with_dtensors_beside_tensors(device):
    """AdamW's foreach kernel (CUDA's default) refuses a mix of DTensors and plain tensors
    ('got mixed torch.Tensor and DTensor'); the loop gives it the two kinds as separate groups."""
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.tasks.losses import BinaryLoss
    from sparkml_dist.train.loop import param_groups
    from sparkml_dist.train.parallel.mesh import TensorParallel

    x = torch.randn(16, LAYOUT.dim, device=device)
    y = torch.stack([(x[:, 0] > 0).float(), torch.ones(16, device=device)], 1)
    with Group(device):
        outcomes = []
        for grouped in (False, True):
            torch.manual_seed(0)
            strategy = TensorParallel(1, 0)
            model, optimizer = strategy.wrap(
                build_model(spec_of("transformer")).to(device),
                lambda params, **_: torch.optim.AdamW(
                    param_groups(list(params)) if grouped else list(params), foreach=True
                ),
            )
            strategy.train_step(model, x, y, BinaryLoss().to(device), 1)
            try:
                optimizer.step()
                outcomes.append("ok")
            except RuntimeError as exc:
                outcomes.append(str(exc))
    assert "mixed torch.Tensor and DTensor" in outcomes[0], "without groups the kernel refuses the mix"
    assert outcomes[1] == "ok"


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.precision=fp16\ntrain.device=cpu", "fp16 needs a GPU"),
        (
            "train.precision=fp16\ntrain.strategy=fsdp",
            "train.precision=fp16 is not available with train.strategy=fsdp",
        ),
        (
            "train.cuda_graph=on\ntrain.device=cpu",
            "train.cuda_graph=on captures a data-parallel step on a GPU",
        ),
        ("train.cuda_graph=on\ntrain.strategy=fsdp", "train.cuda_graph=on captures"),
        ("train.cuda_graph=on\ntrain.backend=horovod", "Horovod averages gradients from hooks"),
        ("train.strategy=pipeline\ntrain.num_ranks=1\nmodel.kind=transformer", "needs at least 2"),
        ("train.precision=fp8", "train.precision"),
    ],
    ids=lambda v: v.split("\n")[0] if "=" in v else v[:20],
)
def test_settings_that_cannot_work_are_refused_at_load_naming_the_key(override, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_config(ROOT / "conf" / "adult.yaml", override.split("\n"))


def test_bf16_and_graph_settings_that_can_work_load():
    cfg = load_config(
        ROOT / "conf" / "adult.yaml",
        ["train.precision=bf16", "train.cuda_graph=on", "train.device=cuda", "train.tf32=false"],
    )
    assert (cfg.train.precision, cfg.train.cuda_graph, cfg.train.tf32) == ("bf16", "on", False)


def test_a_cpu_rank_asked_for_fp16_names_the_key():
    """train.device=auto with fp16 loads (the ranks may have GPUs); a rank that finds none says so."""
    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.methods.data_parallel import place_data_parallel
    from sparkml_dist.train.job import TrainJob
    from sparkml_dist.train.loop import place

    cfg = load_config(ROOT / "conf" / "adult.yaml", ["train.precision=fp16"])
    job = TrainJob(
        data_root="",
        train_groups=(),
        val_groups=(),
        model_spec=spec_of("mlp"),
        train=cfg.train,
        checkpoint_dir="",
        placement=place_data_parallel,
    )
    with pytest.raises(
        ConfigError, match="rank 0 on h trains on cpu: train.precision=fp16 runs on a GPU only"
    ):
        place(job, RankContext(0, 1, 0, 1, 0, 1, "h", "h", 0), torch.device("cpu"))


BLOCKER = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('pyspark', 'mlflow', 'py4j'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Blocker())
"""

RANK_MODULES = [
    "sparkml_dist.train.loop",
    "sparkml_dist.train.graphed",
    "sparkml_dist.train.feed",
    "sparkml_dist.methods.builtin",
    "sparkml_dist.train.parallel.mesh",
    "sparkml_dist.train.parallel.pipeline",
    "sparkml_dist.train.horovod_parallel",
    "sparkml_dist.methods.async_ps.worker",
    "sparkml_dist.data.loader",
    "sparkml_dist.models.factory",
    "sparkml_dist.inference.predict",
    "sparkml_dist.inference.device",
    "sparkml_dist.launch.torch_backend",
    "sparkml_dist.launch.horovod_backend",
    "bench.gpu",
]


RUN_WITHOUT_SPARK = """
import tempfile, torch, torch.distributed as dist
from pathlib import Path
from bench.gpu import method_run, write_split
from sparkml_dist.tasks.base import Target
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
root = Path(tempfile.mkdtemp())
groups = {"train": write_split(root / "train", 2048, 1), "val": write_split(root / "val", 512, 2)}
method_run(root, groups, torch.device("cpu"), "ddp", "mlp", {"epochs": 2, "checkpoint_every_steps": 2}, rows=2048)
for task, classes in (("multiclass", ("a", "b", "c")), ("regression", ())):  # each task's per-epoch metrics
    target = Target(task, classes)
    outputs = torch.zeros(4, 3) if classes else torch.zeros(4)
    packed = torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0], [1.0, 1.0]])
    target.kind.extra_from_bins(target, target.kind.held_out_bins(target, outputs, packed))
"""


def test_rank_code_imports_and_trains_with_pyspark_and_mlflow_blocked():
    """Training code runs where there is no Spark: a rank's modules import, and a rank trains two
    epochs with mid-epoch checkpoints and every task's epoch metrics, with pyspark and MLflow unimportable."""
    code = (
        BLOCKER
        + "".join(f"import {m}\n" for m in RANK_MODULES)
        + RUN_WITHOUT_SPARK
        + "assert not any(m.startswith(('pyspark', 'mlflow')) for m in sys.modules)\nprint('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("device", DEVICES)
def test_scoring_on_a_device_gives_the_cpus_outputs(device):
    from sparkml_dist.inference.predict import ModelCache, network_outputs
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.weights import state_dict_to_bytes

    rng = np.random.default_rng(3)
    compact = np.stack(
        [
            rng.normal(size=5000) if b.kind == "value" else rng.integers(0, b.size, 5000)
            for b in LAYOUT.blocks
        ],
        axis=1,
    ).astype(np.float32)
    torch.manual_seed(0)
    weights = state_dict_to_bytes(build_model(spec_of("transformer")).state_dict())
    cache = ModelCache()
    on_cpu = cache.get("k", spec_of("transformer"), lambda: weights, "cpu")
    on_device = cache.get("k", spec_of("transformer"), lambda: weights, device)
    assert len(cache) == (1 if device == "cpu" else 2), "one model per key per device"
    expected = network_outputs(on_cpu, compact, 1024, LAYOUT)
    np.testing.assert_allclose(
        network_outputs(on_device, compact, 4096, LAYOUT), expected, rtol=1e-5, atol=1e-5
    )


def test_score_device_setting():
    from sparkml_dist.inference.device import scoring_device

    assert scoring_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert scoring_device("auto").type == scoring_device("cuda").type == "cuda"
    else:
        assert scoring_device("auto") == torch.device("cpu")
        with pytest.raises(RuntimeError, match="score.device=cuda but torch sees no GPU"):
            scoring_device("cuda")


def test_make_gpu_check_trains_and_scores_through_the_projects_code(tmp_path):
    """`make gpu-check` (docs/gpu.md) at its CPU size: the loop's rows beside the bare ceilings,
    every check passing. GPU_CHECK_OUT keeps the report out of the checkout."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "GPU_CHECK_OUT": str(out)}
    done = subprocess.run(
        ["make", "gpu-check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    whats = {(r["model"], r["what"]) for r in report["rows"]}
    for model in ("mlp", "transformer"):
        assert {(model, "loop"), (model, "bare eager")} <= whats
    assert ("mlp", "scoring") in whats and ("mlp", "bare forward") in whats
    assert all(r["per_s"] > 0 for r in report["rows"])
    assert {r["ratio_of"] for r in report["ratios"]} >= {"loop / bare eager", "scoring / bare forward"}


def test_docs_gpu_table_is_generated_from_the_gpu_run():
    """docs/gpu.md's table is bench/gpu_results.json as `bench.gpu.markdown` writes it."""
    from bench.gpu import BEGIN, END, GPU_RESULTS, markdown

    doc = (ROOT / "docs" / "gpu.md").read_text()
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table.strip() == markdown(json.loads(GPU_RESULTS.read_text())).strip(), (
        "run: python -m bench.gpu --write-doc"
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_federated_client_trains_in_the_runs_precision(precision):
    """train.precision reaches the federated clients (CPU: fp32 or bf16 autocast): a round's update
    moves the weights, and a bf16 client's update points where its fp32 twin's does (AdamW's
    normalised steps make elementwise tolerances meaningless; the direction is what matters)."""
    from sparkml_dist.methods.federated.client import RoundTask, _train_locally
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.models.weights import state_dict_to_bytes
    from sparkml_dist.tasks.base import Target

    torch.manual_seed(0)
    spec = spec_of("mlp")
    state = build_model(spec).state_dict()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, LAYOUT.dim)).astype(np.float32)
    y = np.stack([(x[:, 0] > 0), np.ones(512)], axis=1).astype(np.float32)
    updates = {}
    for p in ("fp32", precision):
        task = RoundTask(
            0,
            (0,),
            spec,
            state_dict_to_bytes(state),
            1,
            64,
            1e-3,
            0.0,
            None,
            0.0,
            60.0,
            target=Target("binary", ("0", "1")),
            precision=p,
        )
        update, late, loss = _train_locally(0, x, y, state, task)
        assert not late and 0.0 < loss < 1.0
        updates[p] = torch.cat([v.reshape(-1) for v in update.values()])
    assert float(updates[precision].abs().sum()) > 0
    cosine = torch.nn.functional.cosine_similarity(updates[precision], updates["fp32"], dim=0)
    assert cosine > 0.95, f"bf16 update against fp32: cosine {float(cosine):.3f}"
    if precision == "bf16":
        assert not torch.equal(updates["bf16"], updates["fp32"]), "the bf16 client really ran in bf16"


@pytest.mark.parametrize("skip", [0, 5])
def test_the_gpu_feed_cuts_the_batches_the_host_cuts(synthetic, skip):
    """The GPU feed ships whole shuffle buffers with their permutation and permutes and cuts them
    where the tensors are (`train.feed.packed_batches`); here on CPU tensors: the same batches, in
    the same order, as the host loader's, also resumed mid-epoch (exact resume relies on it)."""
    from sparkml_dist.data.loader import ShardLoader
    from sparkml_dist.train.feed import packed_batches

    root, groups = synthetic
    first = groups["train"][0]
    # buffers of 3,500, 4,100 and 2,900 rows (a row group's leading rows): batches of 1,000 span them
    uneven = [dataclasses.replace(first, rows=rows) for rows in (3500, 4100, 2900)]
    loader = ShardLoader(str(root), uneven, 0, 1, 1000, 7, buffer_row_groups=1, layout=LAYOUT, dense=False)
    host = list(loader.epoch(1, skip_batches=skip))
    shipped = (
        (torch.from_numpy(np.concatenate([x, y], axis=1)), None if order is None else torch.from_numpy(order))
        for x, y, order in loader.buffers(1)
    )
    fed = list(packed_batches(shipped, loader.batch_width, loader.batch_size, skip))
    assert len(fed) == len(host) == loader.num_batches - skip
    for (hx, hy), (fx, fy) in zip(host, fed):
        np.testing.assert_array_equal(fx.numpy(), hx)
        np.testing.assert_array_equal(fy.numpy(), hy)


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_expansion_is_the_hosts(device):
    from sparkml_dist.data.expand import DeviceExpander

    rng = np.random.default_rng(5)
    compact = np.stack(
        [rng.normal(size=300) if b.kind == "value" else rng.integers(0, b.size, 300) for b in LAYOUT.blocks],
        axis=1,
    ).astype(np.float32)
    dense = DeviceExpander(LAYOUT, device, LAYOUT.dim)(torch.from_numpy(compact).to(device))
    np.testing.assert_array_equal(dense.cpu().numpy(), LAYOUT.expand(compact))


def test_padding_rows_of_weight_zero_change_neither_loss_nor_gradients():
    """What a captured step's static batch relies on for a short last batch."""
    from sparkml_dist.models.factory import build_model
    from sparkml_dist.tasks.losses import BinaryLoss

    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", LAYOUT.dim, hidden=(16,)))
    x = torch.randn(10, LAYOUT.dim)
    y = torch.stack([(x[:, 0] > 0).float(), torch.rand(10) + 0.5], 1)
    padded_x = torch.cat([x, torch.randn(6, LAYOUT.dim) * 100])  # whatever the buffer held before
    padded_y = torch.cat([y, torch.stack([torch.ones(6), torch.zeros(6)], 1)])
    results = []
    for features, targets in ((x, y), (padded_x, padded_y)):
        model.zero_grad()
        loss = BinaryLoss()(model(features), targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for padded, plain in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(padded, plain)


def test_a_checkpoints_optimizer_state_keeps_this_runs_kernel_options():
    """A CPU run's checkpoint resumed by a run whose step needs AdamW's fused kernel: the state
    loads, the kernel choice stays this run's (torch's load would take the saved one's)."""
    from sparkml_dist.train.loop import load_optimizer_state

    params = [torch.nn.Parameter(torch.randn(4, 3))]
    saved = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    params[0].grad = torch.ones(4, 3)
    saved.step()
    fused = torch.optim.AdamW(params, lr=1e-3, fused=True)
    load_optimizer_state(fused, saved.state_dict())
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["foreach"] is None
    assert float(fused.state[params[0]]["step"]) == 1.0, "the saved state is loaded"
