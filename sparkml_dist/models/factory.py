"""Model factory: a model is rebuilt anywhere from its `ModelSpec` plus a state_dict, so nothing
user-writable is ever unpickled (state_dicts load with weights_only=True)."""

from __future__ import annotations

import torch
from torch import nn

from sparkml_dist.config.schema import ModelConfig
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.transformer import TabularTransformer, token_layout


class TabularMLP(nn.Module):
    """Dense features -> one logit (binary classification)."""

    def __init__(self, input_dim: int, hidden: list[int], dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def model_spec(cfg: ModelConfig, input_dim: int, feature_names: list[str] | None = None) -> ModelSpec:
    shape = None
    if cfg.kind == "transformer":
        names = feature_names or [f"f{i}" for i in range(input_dim)]
        t = cfg.transformer
        shape = TransformerShape(tuple(token_layout(names)), t.d_model, t.heads, t.layers, t.mlp_hidden)
    return ModelSpec(cfg.kind, int(input_dim), cfg.dropout, tuple(cfg.hidden), shape)


def build_model(spec: ModelSpec) -> nn.Module:
    if spec.kind == "mlp":
        return TabularMLP(spec.input_dim, list(spec.hidden), spec.dropout)
    if spec.kind == "transformer" and spec.transformer is not None:
        t = spec.transformer
        return TabularTransformer(list(t.layout), t.d_model, t.heads, t.layers, t.mlp_hidden, spec.dropout)
    raise ValueError(f"unknown model kind {spec.kind!r}; known: mlp, transformer")
