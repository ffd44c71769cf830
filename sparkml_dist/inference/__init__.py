"""Prediction functions and Spark scoring (model cached per executor Python process).

`predict` needs only numpy and torch: the logged pyfunc model imports it where there is no
pyspark (docs/serving.md), so the Spark side (`score_features`) is imported on first use only."""

from __future__ import annotations

from sparkml_dist.exports import lazy_getattr

_EXPORTS = {"ModelBundle": "sparkml_dist.inference.bundle", "score_features": "sparkml_dist.inference.udf"}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 -- a list; the names resolve lazily (__getattr__)


__getattr__ = lazy_getattr("sparkml_dist.inference", _EXPORTS, globals())
