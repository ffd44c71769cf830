"""Spark ML's StringIndexer keeping each column's most frequent values (`features.max_categories`).

A title or a key column is tens of thousands of one-hot slots, most of them a value seen once,
that the model can only memorise (ggplot2movies' titles made its input 45,826 wide). Spark ML's
StringIndexer has no cap; scikit-learn's OneHotEncoder has `max_categories`. This is that cap
on Spark's own indexer: fitted with `stringOrderType="frequencyDesc"` (ties alphabetical), its
labels are already most frequent first, so keeping the first N is keeping the N most frequent.
With `handleInvalid="keep"` a value not in the labels indexes to len(labels), the slot a value
never seen in training takes, so the rarer values share that slot at training and at scoring
alike. The result is Spark's own `StringIndexerModel`: it saves, loads and compiles
(data/features.py) as before.
"""

from __future__ import annotations

from pyspark.ml import Estimator
from pyspark.ml.feature import StringIndexer, StringIndexerModel
from pyspark.sql import DataFrame

__all__ = ["MostFrequentIndexer"]


class MostFrequentIndexer(Estimator):
    """Fits `indexer` (frequencyDesc, handleInvalid keep) and keeps each column's first `limit`
    labels."""

    def __init__(self, indexer: StringIndexer, limit: int) -> None:
        super().__init__()
        if indexer.getStringOrderType() != "frequencyDesc" or indexer.getHandleInvalid() != "keep":
            raise ValueError(
                "MostFrequentIndexer caps a StringIndexer ordered frequencyDesc that keeps unseen values"
            )
        if limit < 1:
            raise ValueError(f"features.max_categories must be at least 1, not {limit}")
        self._indexer = indexer
        self._limit = limit

    def _fit(self, dataset: DataFrame) -> StringIndexerModel:
        fitted = self._indexer.fit(dataset)
        labels = [list(column) for column in fitted.labelsArray]
        if all(len(column) <= self._limit for column in labels):
            return fitted
        return StringIndexerModel.from_arrays_of_labels(
            [column[: self._limit] for column in labels],
            inputCols=fitted.getInputCols(),
            outputCols=fitted.getOutputCols(),
            handleInvalid="keep",
        )
