"""Prediction functions and Spark scoring (model cached per executor Python process).

`predict` needs only numpy and torch: the logged pyfunc model imports it where there is no
pyspark (docs/serving.md), so the Spark side (`score_features`) is imported on first use only."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"ModelBundle": "sparkml_dist.inference.bundle", "score_features": "sparkml_dist.inference.udf"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkml_dist.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
