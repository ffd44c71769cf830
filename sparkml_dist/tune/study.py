"""The Optuna study a tune job works on: its storage (resumable), sampler, pruner and direction."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Literal

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.config.tune import TuneConfig
from sparkml_dist.errors import ConfigError
from sparkml_dist.tasks.base import Task

HEARTBEAT_S = 5  # a running trial's driver beats this often; one silent for GRACE_S died (it is failed)
GRACE_S = 15


@dataclass(frozen=True)
class StudyRef:
    """What a process needs to open the study (the tune driver, or rank 0 of a trial to report)."""

    storage_url: str
    name: str
    direction: Literal["maximize", "minimize"]
    pruner: str
    pruner_startup_trials: int

    def load(self):
        import optuna

        return optuna.load_study(
            study_name=self.name,
            storage=open_storage(self.storage_url),
            pruner=make_pruner(self.pruner, self.pruner_startup_trials),
        )


def study_ref(cfg: JobConfig, task: Task) -> tuple[StudyRef, str]:
    """The study for `cfg` and the epoch-record metric it optimises (e.g. val_accuracy)."""
    tune = cfg.tune
    metric = tune.metric or task.held_out_metric
    direction: Literal["maximize", "minimize"]
    if metric == "loss":
        direction = "minimize"
    elif metric in (task.held_out_metric, *task.held_out_extra):
        direction = "maximize" if task.metrics[metric] == "higher" else "minimize"
    else:
        known = ", ".join(repr(m) for m in (task.held_out_metric, *task.held_out_extra, "loss"))
        raise ConfigError(
            f"tune.metric {metric!r}: each epoch validates the {task.name} model on {known}; use one of those"
        )
    return StudyRef(
        storage_url(cfg),
        tune.study_name or f"tune-{cfg.tracking.registered_model}",
        direction,
        tune.pruner,
        tune.pruner_startup_trials,
    ), f"val_{metric}"


def storage_url(cfg: JobConfig) -> str:
    if cfg.tune.storage:
        return cfg.tune.storage
    local = storage.local_path(cfg.output.root)
    if local is None:
        raise ConfigError(
            f"tune.storage: output.root {cfg.output.root} is not a local path; give the study a "
            f"database URL (e.g. postgresql://... or sqlite:////shared/path/study.db)"
        )
    path = os.path.abspath(os.path.join(local, "tune", "study.db"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return f"sqlite:///{path}"


def open_storage(url: str):
    import optuna

    # several processes write one sqlite file (the tune driver's threads, each trial's rank 0)
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with warnings.catch_warnings():  # Optuna marks heartbeats experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
        )


def make_pruner(kind: str, startup_trials: int):
    import optuna

    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=0)
    if kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def make_sampler(tune: TuneConfig):
    # pyspark, Optuna: only once a tune job runs
    from sparkml_dist.tune.samplers import TrialSeededRandomSampler, trial_seeded_tpe

    if tune.sampler == "random":
        return TrialSeededRandomSampler(tune.seed)
    return trial_seeded_tpe(tune.seed)


def create_study(ref: StudyRef, tune: TuneConfig):
    """Create the study, or load it to go on where an earlier tune job of the same config stopped."""
    import optuna

    return optuna.create_study(
        study_name=ref.name,
        storage=open_storage(ref.storage_url),
        direction=ref.direction,
        sampler=make_sampler(tune),
        pruner=make_pruner(ref.pruner, ref.pruner_startup_trials),
        load_if_exists=True,
    )
