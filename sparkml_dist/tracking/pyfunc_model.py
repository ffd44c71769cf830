"""The MLflow model: a pyfunc whose artifacts are the model spec, the weights (state_dict)
and the fitted Spark feature pipeline, so one registry version carries everything scoring needs."""

from __future__ import annotations

import json

import mlflow.pyfunc
import numpy as np


class TabularTorchModel(mlflow.pyfunc.PythonModel):
    """pyfunc over already-assembled features (a `features` array column); Spark scoring in this
    library applies the feature pipeline first and then the same weights."""

    def load_context(self, context) -> None:
        import torch

        from sparkml_dist.models.factory import build_model
        from sparkml_dist.models.spec import ModelSpec

        with open(context.artifacts["spec"]) as fh:
            spec = ModelSpec.from_json(json.load(fh))
        self.model = build_model(spec)
        self.model.load_state_dict(torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True))
        self.model.eval()

    def predict(self, context, model_input, params=None):
        from sparkml_dist.inference.predict import predict_proba

        column = model_input["features"] if hasattr(model_input, "columns") else model_input
        x = np.stack([np.asarray(v, dtype=np.float32) for v in column]) if not isinstance(column, np.ndarray) else column
        return predict_proba(self.model, x.astype(np.float32, copy=False))
