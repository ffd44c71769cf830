"""The lifecycle stages. Each is `stage(spark, cfg, ...) -> result` with the artifact references
it produced; jobs, notebooks, the CLI and the pipeline call these same functions."""

from sparkml_dist.data.dataset import PreprocessResult
from sparkml_dist.stages.evaluate import evaluate, evaluate_trained, log_report
from sparkml_dist.stages.preprocess import preprocess
from sparkml_dist.stages.register import RegistryDecision, register, register_evaluated
from sparkml_dist.stages.score import ScoreResult, score
from sparkml_dist.stages.train import TrainResult, train, train_preprocessed

__all__ = [
    "PreprocessResult",
    "RegistryDecision",
    "ScoreResult",
    "TrainResult",
    "evaluate",
    "evaluate_trained",
    "log_report",
    "preprocess",
    "register",
    "register_evaluated",
    "score",
    "train",
    "train_preprocessed",
]
