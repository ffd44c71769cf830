"""The lifecycle stages. Each is `stage(spark, cfg, ...) -> result` with the artifact references
it produced; jobs, notebooks, the CLI and the pipeline call these same functions."""

from sparkml_dist.stages.evaluate import evaluate
from sparkml_dist.stages.paths import OutputPaths
from sparkml_dist.stages.preprocess import PreprocessResult, preprocess
from sparkml_dist.stages.register import RegistryDecision, register
from sparkml_dist.stages.score import ScoreResult, score
from sparkml_dist.stages.train import TrainResult, train

__all__ = [
    "OutputPaths", "PreprocessResult", "RegistryDecision", "ScoreResult", "TrainResult",
    "evaluate", "preprocess", "register", "score", "train",
]
