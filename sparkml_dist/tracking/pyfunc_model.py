"""The MLflow model: a pyfunc whose artifacts are the model spec, the weights (state_dict), the
task's target, the fitted Spark feature pipeline (for Spark scoring) and the same pipeline as
plain data (`raw_features.json`, for scoring raw rows anywhere MLflow serves, without Spark).

Only numpy, pandas, torch and MLflow are imported here and in what it loads: the model ships the
package's code (`code_paths`), and a serving environment has no pyspark.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Target

if TYPE_CHECKING:
    from sparkml_dist.data.raw_features import RawFeatures


class TabularTorchModel(PythonModel):
    """`predict` takes raw rows, a pandas DataFrame with the source columns, when the model was
    logged with its feature pipeline (`raw_features`), and returns the task's prediction columns
    (binary: probability and prediction; multiclass: prediction, probability, probabilities;
    regression: prediction) plus, for a classifier, `predicted_label` in the label's own values.
    Without a pipeline it takes already-assembled features (a `features` array column) and
    returns a binary model's probability."""

    def load_context(self, context) -> None:
        import torch

        # torch, pyarrow: only once MLflow loads or calls the model
        from sparkml_dist.data.raw_features import RawFeatures
        from sparkml_dist.inference.device import scoring_device
        from sparkml_dist.models.factory import build_model

        with open(context.artifacts["spec"]) as fh:
            spec = ModelSpec.from_json(json.load(fh))
        self.target = UNRECORDED_TARGET
        if context.artifacts.get("target"):
            with open(context.artifacts["target"]) as fh:
                self.target = Target.from_json(json.load(fh))
        self.raw: RawFeatures | None = None
        if context.artifacts.get("raw_features"):
            with open(context.artifacts["raw_features"]) as fh:
                self.raw = RawFeatures.from_json(json.load(fh))
        self.model = build_model(spec)
        self.model.load_state_dict(
            torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True)
        )
        # a served model uses the GPU where there is one (SPARKML_DIST_SCORE_DEVICE=cpu keeps it on the CPU)
        self.model.eval().to(scoring_device(os.environ.get("SPARKML_DIST_SCORE_DEVICE", "auto")))

    # the hint is one MLflow infers no schema from: the model's signature stays the one it is logged
    # with, and MLflow does not warn at import that predict has no type hints
    def predict(self, context, model_input: pd.DataFrame, params=None):
        # torch, pyarrow: only once MLflow loads or calls the model
        from sparkml_dist.inference.predict import predict, predict_proba

        x = _raw_matrix(self.raw, model_input) if self.raw is not None else _features_matrix(model_input)
        if self.raw is None and self.target.kind.thresholded:  # the features signature: the probability alone
            return predict_proba(self.model, x)
        out = pd.DataFrame(
            {k: (list(v) if v.ndim > 1 else v) for k, v in predict(self.model, self.target, x).items()}
        )
        if self.raw is not None and self.target.classes:
            out["predicted_label"] = [self.target.classes[i] for i in out["prediction"]]
        return out


def _raw_matrix(raw: RawFeatures, rows: pd.DataFrame) -> np.ndarray:
    from mlflow.exceptions import MlflowException

    # pyarrow: only once MLflow loads or calls the model
    from sparkml_dist.data.raw_features import RawRowError

    try:
        return raw.dense(rows)
    except RawRowError as exc:  # the scoring server answers 400 with this message
        raise MlflowException.invalid_parameter_value(f"cannot score these rows: {exc}") from None


def _features_matrix(model_input) -> np.ndarray:
    column = model_input["features"] if hasattr(model_input, "columns") else model_input
    x = (
        np.stack([np.asarray(v, dtype=np.float32) for v in column])
        if not isinstance(column, np.ndarray)
        else column
    )
    return x.astype(np.float32, copy=False)
