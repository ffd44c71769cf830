"""Model factory: a model is rebuilt anywhere from a small JSON-able spec plus a state_dict,
so nothing user-writable is ever unpickled (state_dicts load with weights_only=True)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from sparkml_dist.config.schema import ModelConfig
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


def model_spec(cfg: ModelConfig, input_dim: int, feature_names: list[str] | None = None) -> dict[str, Any]:
    spec = {"kind": cfg.kind, "input_dim": int(input_dim), "hidden": list(cfg.hidden), "dropout": cfg.dropout}
    if cfg.kind == "transformer":
        names = feature_names or [f"f{i}" for i in range(input_dim)]
        t = cfg.transformer
        spec.update(layout=token_layout(names), d_model=t.d_model, heads=t.heads, layers=t.layers,
                    mlp_hidden=t.mlp_hidden)
    return spec


def build_model(spec: dict[str, Any]) -> nn.Module:
    if spec["kind"] == "mlp":
        return TabularMLP(spec["input_dim"], spec["hidden"], spec["dropout"])
    if spec["kind"] == "transformer":
        return TabularTransformer(spec["layout"], spec["d_model"], spec["heads"], spec["layers"],
                                  spec["mlp_hidden"], spec["dropout"])
    raise ValueError(f"unknown model kind {spec['kind']!r}; known: mlp, transformer")
