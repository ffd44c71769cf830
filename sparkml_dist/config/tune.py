"""The `tune:` section: a search space over any config key, and how the study runs (sparkml-dist tune).

    tune:
      trials: 12
      parallel_trials: 2
      space:
        train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}
        model.hidden: {choice: [[128, 64], [256, 128]]}
        train.batch_size: {int: [128, 1024], log: true}

A key that is not a config key, or a value outside the key's own schema (checked at both ends of
a range and for every choice), is an error at load time that names `tune.space.<key>`.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparkml_dist.config.overrides import apply_overrides

KINDS = ("loguniform", "uniform", "int", "choice")
SEARCHABLE = ("model", "train", "evaluate", "federated")  # what a trial may change; the rest is the study's


class ParamSpace(BaseModel):
    """One key's range: exactly one of loguniform / uniform / int ([low, high]) or choice ([values])."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loguniform: tuple[float, float] | None = Field(
        None, description="[low, high], sampled on a log scale (low > 0)"
    )
    uniform: tuple[float, float] | None = Field(None, description="[low, high], floats")
    int: tuple[builtins.int, builtins.int] | None = Field(
        None, description="[low, high], integers, both included"
    )
    choice: list[Any] | None = Field(
        None, description="the values to choose from (any YAML values, e.g. lists)"
    )
    log: bool = Field(False, description="int: sample on a log scale")
    step: float | None = Field(None, gt=0, description="uniform / int: a step between values")

    @model_validator(mode="after")
    def _one_kind(self) -> ParamSpace:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {', '.join(given) or 'none'})")
        low_high = getattr(self, given[0]) if given[0] != "choice" else None
        if low_high is not None and not low_high[0] < low_high[1]:
            raise ValueError(f"{given[0]}: [low, high] with low < high (got {list(low_high)})")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError("loguniform: low must be > 0")
        if self.choice is not None and not self.choice:
            raise ValueError("choice: at least one value")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)

    def corners(self) -> list[Any]:
        """The values that bound this range: both ends, or every choice (each must be valid)."""
        if self.choice is not None:
            return list(self.choice)
        return list(getattr(self, self.kind))


class TuneConfig(BaseModel):
    """Hyperparameter search (`sparkml-dist tune`): each trial is a barrier training job of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    space: dict[str, ParamSpace] = Field(
        default_factory=dict,
        description="config key -> {loguniform|uniform|int: [low, high]} or {choice: [...]}",
    )
    trials: int = Field(8, ge=1, description="finished trials (complete or pruned) the study should reach")
    parallel_trials: int = Field(2, ge=1, description="trials running at once, each a barrier job")
    ranks_per_trial: int = Field(1, ge=1, description="train.num_ranks of every trial")
    metric: str | None = Field(
        None,
        description="validation metric to optimise: the task's held-out metric "
        "(default: accuracy, or rmse), 'loss', binary's 'roc_auc', "
        "multiclass's 'macro_f1' (imbalanced classes) or regression's "
        "'mae' or 'r2'; its direction comes from the task",
    )
    sampler: Literal["tpe", "random"] = Field("tpe", description="Optuna sampler")
    seed: int = Field(0, description="the sampler's seed")
    pruner: Literal["median", "asha", "none"] = Field(
        "median", description="stop losing trials at an epoch end"
    )
    pruner_startup_trials: int = Field(2, ge=0, description="median: finished trials before any pruning")
    timeout_s: float | None = Field(None, gt=0, description="start no new trial after this many seconds")
    max_failed_trials: int = Field(
        2, ge=0, description="failed trials tolerated before the study stops with an error"
    )
    storage: str | None = Field(
        None, description="Optuna storage URL (default: sqlite file <output.root>/tune/study.db)"
    )
    study_name: str | None = Field(None, description="default: tune-<tracking.registered_model>")


def space_problems(
    raw: dict, space: dict[str, ParamSpace], validate: Callable[[dict], str | None]
) -> list[tuple[str, str]]:
    """(key, problem) for every space entry whose key is unknown or whose range leaves the key's
    schema: `validate(raw)` returns the validation message of a config, or None."""

    base = {k: v for k, v in raw.items() if k != "tune"}
    problems = []
    for key, param in space.items():
        if key.split(".")[0] not in SEARCHABLE:
            problems.append(
                (
                    key,
                    f"trials share one preprocess output, tracking and session: search keys under "
                    f"{', '.join(SEARCHABLE)}",
                )
            )
            continue
        if key == "train.num_ranks":
            problems.append((key, "every trial has tune.ranks_per_trial ranks: set that instead"))
            continue
        for value in param.corners():
            message = validate(apply_overrides(base, [f"{key}={json.dumps(value)}"]))
            if message is not None and f"{key}: unknown key" in message:
                problems.append((key, "not a config key: check its spelling against docs/configuration.md"))
                break
            if message is not None:
                problems.append((key, f"{json.dumps(value)} is not a valid value here: {message}"))
                break
    return problems
