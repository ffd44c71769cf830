"""The MLflow model: a pyfunc whose artifacts are the model spec, the weights (state_dict)
and the fitted Spark feature pipeline, so one registry version carries everything scoring needs."""

from __future__ import annotations

import json

import mlflow.pyfunc
import numpy as np


class TabularTorchModel(mlflow.pyfunc.PythonModel):
    """pyfunc over already-assembled features (a `features` array column); Spark scoring in this
    library applies the feature pipeline first and then the same weights. Returns a binary
    model's probability of the positive class, and other tasks' prediction columns."""

    def load_context(self, context) -> None:
        import torch

        from sparkml_dist.models.factory import build_model
        from sparkml_dist.models.spec import ModelSpec
        from sparkml_dist.tasks.base import Target

        with open(context.artifacts["spec"]) as fh:
            spec = ModelSpec.from_json(json.load(fh))
        target_file = context.artifacts.get("target")
        self.target = Target("binary")
        if target_file:
            with open(target_file) as fh:
                self.target = Target.from_json(json.load(fh))
        self.model = build_model(spec)
        self.model.load_state_dict(torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True))
        self.model.eval()

    def predict(self, context, model_input, params=None):
        import pandas as pd

        from sparkml_dist.inference.predict import predict, predict_proba

        column = model_input["features"] if hasattr(model_input, "columns") else model_input
        x = np.stack([np.asarray(v, dtype=np.float32) for v in column]) if not isinstance(column, np.ndarray) else column
        x = x.astype(np.float32, copy=False)
        if self.target.kind.thresholded:
            return predict_proba(self.model, x)
        columns = predict(self.model, self.target, x)
        return pd.DataFrame({k: (list(v) if v.ndim > 1 else v) for k, v in columns.items()})
