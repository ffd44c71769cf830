"""Model factory: a model is rebuilt anywhere from its `ModelSpec` plus a state_dict, so nothing
user-writable is ever unpickled (state_dicts load with weights_only=True)."""

from __future__ import annotations

import json

import torch
from torch import nn

from sparkml_dist.config.schema import ModelConfig
from sparkml_dist.models.custom import CustomModel, TaskSpec, build_custom
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.transformer import TabularTransformer, token_layout


class TabularMLP(nn.Module):
    """Dense features -> `output_dim` outputs ([rows] when it is 1: a logit or a value)."""

    def __init__(self, input_dim: int, hidden: list[int], dropout: float, output_dim: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, output_dim))
        self.net = nn.Sequential(*layers)
        self.output_dim = output_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.output_dim == 1 else out

    def activation_floats_per_row(self) -> int:
        """The widest tensor a row becomes in the forward pass (the input included), in floats:
        what scoring sizes its forward chunks by (`inference/predict.py::forward_rows`)."""
        return max([self.net[0].in_features, *(m.out_features for m in self.net if isinstance(m, nn.Linear))])


def model_spec(
    cfg: ModelConfig,
    input_dim: int,
    feature_names: list[str] | None = None,
    output_dim: int = 1,
    task: TaskSpec | None = None,
) -> ModelSpec:
    shape = None
    custom = None
    if cfg.kind == "custom":
        names = tuple(feature_names or [f"f{i}" for i in range(input_dim)])
        custom = CustomModel(
            str(cfg.factory),
            json.dumps(cfg.options, sort_keys=True),
            names,
            task or TaskSpec("binary", output_dim),
        )
    if cfg.kind == "transformer":
        names = feature_names or [f"f{i}" for i in range(input_dim)]
        t = cfg.transformer
        shape = TransformerShape(tuple(token_layout(names)), t.d_model, t.heads, t.layers, t.mlp_hidden)
    return ModelSpec(cfg.kind, int(input_dim), cfg.dropout, tuple(cfg.hidden), shape, output_dim, custom)


def build_model(spec: ModelSpec) -> nn.Module:
    if spec.kind == "mlp":
        return TabularMLP(spec.input_dim, list(spec.hidden), spec.dropout, spec.output_dim)
    if spec.kind == "transformer" and spec.transformer is not None:
        t = spec.transformer
        return TabularTransformer(
            list(t.layout), t.d_model, t.heads, t.layers, t.mlp_hidden, spec.dropout, spec.output_dim
        )
    if spec.kind == "custom" and spec.custom is not None:
        return build_custom(spec.input_dim, spec.custom)
    raise ValueError(f"unknown model kind {spec.kind!r}; known: mlp, transformer, custom")
