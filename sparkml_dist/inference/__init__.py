"""Prediction functions and Spark scoring (model cached per executor Python process)."""

from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.inference.udf import score_features

__all__ = ["ModelBundle", "score_features"]
