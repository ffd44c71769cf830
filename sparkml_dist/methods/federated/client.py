"""What runs on a client (inside its Spark partition): local training from the broadcast global
weights, then clip, noise (federated.privacy) and mask (federated.secure) the update. Only the
update, its sample count and a few scalars leave the partition."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.data.loader import batch_input
from sparkml_dist.methods.federated import privacy, secure
from sparkml_dist.models.factory import build_model
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.models.weights import state_dict_from_bytes
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Target
from sparkml_dist.train.precision import Precision


@dataclass(frozen=True)
class RoundTask:
    """Everything a client needs for one round (broadcast by the driver)."""

    round_index: int
    sampled: tuple[int, ...]
    model_spec: ModelSpec
    global_weights: bytes
    local_epochs: int
    batch_size: int
    learning_rate: float
    proximal_mu: float  # 0: FedAvg
    clip_norm: float | None
    noise_std: float  # per client: noise_multiplier x clip_norm / sqrt(sampled clients)
    time_budget_s: float  # a client still training this long after it started sends no update (late)
    target: Target = UNRECORDED_TARGET  # what the label is: the task's loss
    class_weights: tuple[float, ...] | None = None
    loss_kind: str | None = None  # regression: train.loss
    publics: dict[int, bytes] | None = None  # secure aggregation: every sampled client's public key
    sealed: dict[int, bytes] | None = None  # ... and its private key, sealed so that only it can open it
    round_salt: bytes = b""  # fresh random bytes per round (secure.seal)
    slow_clients: tuple[tuple[int, float], ...] = ()  # tests: (client, seconds of delay per batch)
    layout: FeatureLayout | None = None  # the rows' features are compact (data/layout.py); None: dense
    precision: str = "fp32"  # train.precision: clients train on CPU, so fp32 or bf16 (autocast)


def client_rows(rows: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """A client's (features, label, weight) rows -> features [n, d] (or [n, blocks], compact) and
    packed targets [n, 2]."""
    rows = list(rows)
    x = np.asarray([r[0] for r in rows], dtype=np.float32)
    y = np.asarray([(r[1], r[2]) for r in rows], dtype=np.float32).reshape(len(rows), 2)
    return x, y


def public_key(index: int, rows: Iterable, task: RoundTask) -> dict[str, Any]:
    """Secure aggregation's first pass: a fresh key pair; the public half, and the private half sealed."""
    x, y = client_rows(rows)
    key = secure.new_key()
    return {
        "client": index,
        "public": secure.public_bytes(key),
        "sealed": secure.seal(key, secure.rows_digest(x, y), task.round_salt),
    }


def client_update(index: int, rows: Iterable, task: RoundTask) -> dict[str, Any]:
    torch.set_num_threads(1)
    x, y = client_rows(rows)
    global_state = state_dict_from_bytes(task.global_weights)
    delta, late, loss = _train_locally(index, x, y, global_state, task)
    norm = float(torch.sqrt(sum((d.double() ** 2).sum() for d in delta.values())))
    clipped = task.clip_norm is not None and norm > task.clip_norm
    if task.clip_norm is not None and clipped:
        scale = task.clip_norm / norm
        delta = {k: d * scale for k, d in delta.items()}
    if task.noise_std and not late:  # local Gaussian noise on the clipped update, from the OS CSPRNG
        delta = {k: d + privacy.gaussian(tuple(d.shape), task.noise_std) for k, d in delta.items()}
    samples = 0 if late else len(x)
    update = {
        k: d.double() * samples for k, d in delta.items()
    }  # sample-weighted: the driver divides by the sum
    payload = {
        "client": index,
        "samples": samples,
        "late": late,
        "norm": norm,
        "clipped": clipped,
        "loss": loss,
    }
    if task.publics is None or task.sealed is None:  # both set, or neither: secure aggregation
        return {**payload, "update": update}
    # a late client still sends its masks, so that the others' cancel
    key = secure.unseal(task.sealed[index], secure.rows_digest(x, y), task.round_salt)
    words = secure.quantise(torch.cat([u.reshape(-1) for u in update.values()]).numpy(), len(task.publics))
    return {**payload, "masked": secure.masked(index, key, task.publics, task.round_salt, words)}


def _train_locally(index: int, x: np.ndarray, y: np.ndarray, global_state: dict, task: RoundTask):
    torch.manual_seed(task.round_index * 100_003 + index)
    model = build_model(task.model_spec)
    model.load_state_dict(global_state)
    anchor = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.learning_rate)  # fresh state each round
    loss_fn = task.target.kind.loss(task.target, task.class_weights, task.loss_kind)
    precision = Precision(task.precision, "cpu")
    delay = dict(task.slow_clients).get(index, 0.0)
    # from this client's own start: Spark starts clients as slots free up, and waiting in that
    # queue is not the client's lateness
    deadline = time.time() + task.time_budget_s
    rng = np.random.default_rng([task.round_index, index])
    model.train()
    loss_sum, seen = 0.0, 0
    for _ in range(task.local_epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), task.batch_size):
            if time.time() > deadline:
                return {k: torch.zeros_like(v) for k, v in global_state.items()}, True, 0.0
            time.sleep(delay)
            batch = order[start : start + task.batch_size]
            with precision.autocast():
                outputs = model(torch.from_numpy(batch_input(x[batch], task.layout)))
            loss = loss_fn(outputs.float(), torch.from_numpy(y[batch]))
            if task.proximal_mu:  # FedProx: stay near the global model on skewed clients
                loss = loss + task.proximal_mu / 2 * sum(
                    ((p - anchor[k]) ** 2).sum() for k, p in model.named_parameters()
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum, seen = loss_sum + float(loss.detach()) * len(batch), seen + len(batch)
    local = model.state_dict()
    return {k: (local[k] - global_state[k]).float() for k in global_state}, False, loss_sum / max(seen, 1)
