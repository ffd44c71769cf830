"""Differential privacy of the federated rounds: Gaussian noise from the OS CSPRNG, and the
(epsilon, delta) the run spent, from Opacus' RDP accountant for the subsampled Gaussian mechanism.

Client-level DP: a client's update is clipped to `clip_norm` and noised on the client; the sum of
a round's noise has std `noise_multiplier x clip_norm` over equally weighted clients. The driver
weights updates by their sample counts, so the accountant is given each round's effective noise
multiplier for its most heavily weighted client (noise std of the weighted sum over that client's
largest possible contribution). Sampling is a fixed fraction of clients per round, accounted as
Poisson sampling at that rate (the usual approximation). Sample counts travel in the clear.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch

ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def gaussian(shape: tuple[int, ...], std: float) -> torch.Tensor:
    """N(0, std^2) noise from os.urandom (Box-Muller): no seed anyone could recompute it from."""
    n = math.prod(shape)
    words = np.frombuffer(os.urandom(16 * ((n + 1) // 2)), dtype=np.uint64).reshape(-1, 2)
    u1 = ((words[:, 0] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]
    u2 = (words[:, 1] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    radius = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)])[:n]
    return torch.from_numpy(z.reshape(shape) * std).float()


@dataclass(frozen=True)
class RoundNoise:
    """One round as the accountant sees it."""

    sample_rate: float  # sampled clients / all clients
    noise_multiplier: float  # effective, for the most heavily weighted on-time client


def effective_multiplier(noise_multiplier: float, weights: list[int]) -> float:
    """The weighted sum's noise std over the largest client's sensitivity, in clip-norm units: each
    client's noise (noise_multiplier x C / sqrt(m)) is scaled by its weight like its update."""
    live = [w for w in weights if w > 0]
    if not live:
        return math.inf
    return noise_multiplier * math.sqrt(sum(w * w for w in live) / len(live)) / max(live)


def epsilon(rounds: list[RoundNoise], delta: float) -> float:
    """The (epsilon, delta)-DP epsilon after `rounds`; inf without noise."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    if not rounds:
        return 0.0
    if any(r.noise_multiplier <= 0 for r in rounds):
        return math.inf
    rdp = sum(
        np.asarray(
            compute_rdp(q=r.sample_rate, noise_multiplier=r.noise_multiplier, steps=1, orders=list(ORDERS))
        )
        for r in rounds
        if math.isfinite(r.noise_multiplier)
    )
    if isinstance(rdp, int):  # every round was late or skipped: nothing released
        return 0.0
    with (
        warnings.catch_warnings()
    ):  # tiny noise: "optimal order is the smallest alpha"; epsilon is huge anyway
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)
