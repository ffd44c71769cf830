"""Samplers whose draws do not depend on the order in which parallel trials ask.

Optuna's seeded samplers share one random stream: with trials running at once, which trial gets
which draw depends on thread timing, so a seeded study is not reproducible. Here every random
draw (a RandomSampler's, and TPE's during its startup trials) comes from a stream seeded by
(seed, trial number, parameter name): trial n gets the same values in every run.
(Written against optuna 5.0, pinned: it uses Optuna's search-space transform.)
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import optuna
from optuna._transform import _SearchSpaceTransform


class TrialSeededRandomSampler(optuna.samplers.RandomSampler):
    def __init__(self, seed: int):
        super().__init__(seed=seed)
        self._base_seed = seed

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: optuna.distributions.BaseDistribution,
    ) -> Any:
        rng = np.random.RandomState(zlib.crc32(f"{self._base_seed}|{trial.number}|{param_name}".encode()))
        transform = _SearchSpaceTransform({param_name: param_distribution})
        drawn = rng.uniform(transform.bounds[:, 0], transform.bounds[:, 1])
        return transform.untransform(drawn)[param_name]


def trial_seeded_tpe(seed: int) -> optuna.samplers.TPESampler:
    """TPE whose startup trials (random, before it has history to model) are trial-seeded."""
    sampler = optuna.samplers.TPESampler(seed=seed)
    sampler._random_sampler = TrialSeededRandomSampler(seed)  # the stream TPE draws its startup trials from
    return sampler
