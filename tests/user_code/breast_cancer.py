"""A user's own DDP training function and model: sklearn's Wisconsin breast-cancer data (569 rows,
30 features), a small MLP, torch.distributed initialised from the torchrun environment."""

from __future__ import annotations

import os


def load_rows():
    import numpy as np
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), y.astype(np.float32)


def make_model(width: int = 16):
    from torch import nn

    return nn.Sequential(nn.Linear(30, width), nn.ReLU(), nn.Linear(width, 1))


def train(learning_rate: float, epochs: int = 10, batch_size: int = 32, seed: int = 0):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_rows()
    shard_x, shard_y = torch.from_numpy(x[rank::world]), torch.from_numpy(y[rank::world])
    steps = len(x) // world // batch_size  # every rank takes the same number of steps
    torch.manual_seed(seed)
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(epochs):
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(shard_x), generator=generator)
        for step in range(steps):
            batch = order[step * batch_size : (step + 1) * batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(shard_x[batch]).squeeze(-1), shard_y[batch])
            loss.backward()
            optimizer.step()
        print(f"rank {rank} epoch {epoch} loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = float(
            ((model(torch.from_numpy(x)).squeeze(-1) > 0).float() == torch.from_numpy(y)).float().mean()
        )
    env = {
        k: os.environ.get(k)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
    }
    params = [p.detach().clone().numpy() for p in model.module.parameters()]
    dist.destroy_process_group()
    return {"params": params, "accuracy": accuracy, "env": env, "world": world}


def fail_on_rank(bad_rank: int):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} starting", flush=True)
    if dist.get_rank() == bad_rank:
        raise ValueError(f"bad value on rank {bad_rank}")
    dist.barrier()  # the healthy rank waits here for the failed one
    return "unreachable"


def train_from_dataframe(learning_rate: float, epochs: int = 10, batch_size: int = 32, seed: int = 0):
    """The same model, fed by the DataFrame the distributor deals to the ranks."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import sparkml_dist as sd

    dist.init_process_group("gloo")
    loader = sd.dataframe_loader(batch_size=batch_size, label="label", seed=seed)
    torch.manual_seed(seed)
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x).squeeze(-1), y.float()).backward()
            optimizer.step()
            steps += 1
    x, y = load_rows()
    with torch.no_grad():
        accuracy = float(
            ((model(torch.from_numpy(x)).squeeze(-1) > 0).float() == torch.from_numpy(y)).float().mean()
        )
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"steps": steps, "own_rows": loader.num_rows})
    dist.destroy_process_group()
    return {"accuracy": accuracy, "ranks": gathered}


def resume_after_failure(total_epochs: int):
    """Fails once after saving a checkpoint; the relaunch resumes from it (launch_info says where)."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    import sparkml_dist as sd

    dist.init_process_group("gloo")
    info = sd.launch_info()
    state = Path(info.checkpoint_dir) / "state.json"
    done = json.loads(state.read_text())["epochs_done"] if state.exists() else 0
    for epoch in range(done, total_epochs):
        dist.barrier()
        if dist.get_rank() == 0:
            state.write_text(json.dumps({"epochs_done": epoch + 1}))
        if info.attempt == 0 and epoch == 1:
            raise RuntimeError("simulated crash after epoch 2")
    return {"attempt": info.attempt, "resumed_from": done, "max_attempts": info.max_attempts}


def step_and_leave() -> int:
    """DDP, one backward, the group destroyed, return at once: the pattern that deadlocked torch
    2.13's gloo (sparkml_dist/launch/pg_guard.py) when the DDP model was freed on return."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.randn(8, 4)).sum().backward()
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank
