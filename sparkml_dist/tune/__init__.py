"""Hyperparameter search on Spark (`sparkml-dist tune`): Optuna picks each trial's config, every
trial is a barrier training job of its own over the one preprocess output, several run at once,
losing trials are pruned at an epoch end, and the best trial's model goes through the gate."""

from sparkml_dist.tune.runner import TuneResult, run_tune

__all__ = ["TuneResult", "run_tune"]
