"""DDP's gradients averaged through shared memory (train/shm_allreduce.py): the same training as
gloo's allreduce, ranks that stay identical, a fallback to the process group for ranks that do
not share /dev/shm, and a clear error when a peer dies at the barrier."""

import json
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from sparkml_dist.launch import TorchBackend, run_barrier


def ddp_rank(ctx, payload):
    """Six SGD steps of a small MLP under our DDP strategy, each rank on its own batches; with
    `uneven`, rank 1 runs out a batch early and shadows rank 0's last allreduce (DDP's join)."""
    import torch

    from sparkml_dist.train.parallelism import DataParallel

    shared_memory, uneven = payload
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    strategy = DataParallel(ctx.world_size, ctx.rank, shared_memory=shared_memory)
    model, optimizer = strategy.wrap(model, lambda params: torch.optim.SGD(params, lr=0.05))
    batches = torch.Generator().manual_seed(100 + ctx.rank)
    steps = 5 if uneven and ctx.rank == 1 else 6
    with strategy.join(model):
        for _ in range(steps):
            x, y = torch.randn(32, 8, generator=batches), torch.randn(32, 1, generator=batches)
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    return strategy.gradient_path, weights


@pytest.mark.spark
@pytest.mark.parametrize("uneven", [False, True], ids=["even", "one_rank_a_batch_short"])
def test_shared_memory_averaging_trains_the_same_weights_as_gloo(spark, uneven):
    shm = run_barrier(spark, ddp_rank, (True, uneven), 2, TorchBackend(timeout_s=60))
    gloo = run_barrier(spark, ddp_rank, (False, uneven), 2, TorchBackend(timeout_s=60))
    assert [path for path, _ in shm] == ["shared memory"] * 2
    assert [path for path, _ in gloo] == ["process group"] * 2
    assert np.array_equal(shm[0][1], shm[1][1]), "every rank holds the same bytes"
    np.testing.assert_allclose(shm[0][1], gloo[0][1], rtol=1e-5, atol=1e-6)
    alone = run_barrier(spark, ddp_rank, (True, uneven), 1, TorchBackend(timeout_s=60))[0][1]
    assert not np.allclose(shm[0][1], alone, atol=1e-4), "the peer's gradients were averaged in"


# Two plain processes (no Spark) that train as ddp_rank does; argv: rank, port, what rank 1 does
_RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from sparkml_dist.train.parallelism import DataParallel

    rank, port, rank1 = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    strategy = DataParallel(2, rank)
    model, optimizer = strategy.wrap(model, lambda params: torch.optim.SGD(params, lr=0.05))
    if rank == 1 and rank1 == "dies":
        os._exit(3)
    batches = torch.Generator().manual_seed(100 + rank)
    for _ in range(6):
        x, y = torch.randn(32, 8, generator=batches), torch.randn(32, 1, generator=batches)
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(json.dumps({"path": strategy.gradient_path, "sum": float(weights.double().sum())}))
""")

# rank 1 of the pair on a host of its own as far as memory goes: a private /dev/shm
_PRIVATE_SHM = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "--",
    "sh",
    "-c",
    'mount -t tmpfs tmpfs /dev/shm && exec "$@"',
    "private-shm",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(tmp_path, rank1: str) -> list[subprocess.Popen]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    port = _free_port()
    argv = [sys.executable, str(script)]
    wrap_rank1 = _PRIVATE_SHM if rank1 == "private_shm" else []
    return [
        subprocess.Popen(
            prefix + argv + [str(rank), str(port), rank1],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, prefix in ((0, []), (1, wrap_rank1))
    ]


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
        return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_ranks_without_a_shared_dev_shm_fall_back_to_the_process_group(tmp_path):
    done = _finish(_pair(tmp_path, "private_shm"))
    outputs = [json.loads(out) for _, out, _ in done]
    assert [o["path"] for o in outputs] == ["process group"] * 2, [err[-2000:] for _, _, err in done]
    assert outputs[0]["sum"] == outputs[1]["sum"], "the replicas stay identical over gloo"


def test_a_dev_shm_too_small_for_the_slots_falls_back_instead_of_crashing(tmp_path):
    """Both ranks on one host whose /dev/shm (16 KiB here; 64 MiB in a default Docker container)
    cannot hold the slots: the segment is refused when it is made, not by SIGBUS mid-step."""
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    port = _free_port()
    both = (
        f"{sys.executable} {script} 0 {port} x & first=$!; {sys.executable} {script} 1 {port} x; second=$?; "
        "wait $first && exit $second"
    )
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=16k tmpfs /dev/shm && {both}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    outputs = [
        json.loads(found) for found in re.findall(r"\{[^{}]*\}", done.stdout)
    ]  # the two may interleave
    assert done.returncode == 0 and len(outputs) == 2, done.stderr[-2000:]
    assert [o["path"] for o in outputs] == ["process group"] * 2
    assert outputs[0]["sum"] == outputs[1]["sum"]


def test_a_peer_that_dies_at_the_barrier_is_named_instead_of_a_hang(tmp_path):
    started = time.monotonic()
    (code0, _, err0), (code1, _, _) = _finish(_pair(tmp_path, "dies"))
    assert code1 == 3 and code0 != 0
    named = "AllreducePeerLost: gradient allreduce in shared memory: rank(s) [1] never arrived (process"
    assert named in err0, err0[-2000:]
    assert time.monotonic() - started < 60
