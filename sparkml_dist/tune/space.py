"""From a `tune.space` entry to an Optuna suggestion, and from the suggestions to a trial's config."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sparkml_dist.config.loader import parse_config
from sparkml_dist.config.overrides import apply_overrides
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.config.tune import ParamSpace

if TYPE_CHECKING:
    import optuna


def suggest(trial: optuna.Trial, space: dict[str, ParamSpace]) -> dict[str, Any]:
    """One value per key, named by the key (so Optuna's plots and MLflow's params read the same)."""
    return {key: _suggest_one(trial, key, param) for key, param in space.items()}


def _suggest_one(trial: optuna.Trial, key: str, param: ParamSpace) -> Any:
    if param.loguniform is not None:
        return trial.suggest_float(key, *param.loguniform, log=True)
    if param.uniform is not None:
        return trial.suggest_float(key, *param.uniform, step=param.step)
    if param.int is not None:
        return trial.suggest_int(key, *param.int, step=int(param.step or 1), log=param.log)
    # Optuna's categorical choices must be plain scalars: a list value travels as its JSON text
    encoded = [json.dumps(c) for c in param.choice or ()]  # the one kind left: validated at load
    return json.loads(trial.suggest_categorical(key, encoded))


def trial_config(cfg: JobConfig, values: dict[str, Any], ranks: int, output_root: str) -> JobConfig:
    """`cfg` with the trial's values, its rank count and an output root of its own; no tune section."""
    raw = {k: v for k, v in cfg.model_dump(mode="json", exclude_unset=True).items() if k != "tune"}
    sets = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    sets += [f"train.num_ranks={ranks}", f"output.root={json.dumps(output_root)}"]
    return parse_config(apply_overrides(raw, sets), source="tune trial")
