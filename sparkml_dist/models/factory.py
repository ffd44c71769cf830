"""Model factory: a model is rebuilt anywhere from its `ModelSpec` plus a state_dict, so nothing
user-writable is ever unpickled (state_dicts load with weights_only=True)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import torch
from torch import nn

from sparkml_dist.config.schema import ModelConfig
from sparkml_dist.models.custom import CustomModel, TaskSpec, build_custom
from sparkml_dist.models.kinds import MODEL_KINDS, SpecRequest
from sparkml_dist.models.spec import ModelSpec, TransformerShape
from sparkml_dist.models.transformer import TabularTransformer, token_layout

T = TypeVar("T")


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
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        return max([linears[0].in_features, *(m.out_features for m in linears)])


def model_spec(
    cfg: ModelConfig,
    input_dim: int,
    feature_names: list[str] | None = None,
    output_dim: int = 1,
    task: TaskSpec | None = None,
) -> ModelSpec:
    """The spec of `cfg`'s network for this input and output: the fields every kind shares, and
    the kind's own from its registry entry (`models/kinds.py`)."""
    names = tuple(feature_names or [f"f{i}" for i in range(input_dim)])
    request = SpecRequest(cfg, int(input_dim), names, output_dim, task or TaskSpec("binary", output_dim))
    own = MODEL_KINDS.get(cfg.kind).spec_fields(request)
    return ModelSpec(cfg.kind, int(input_dim), cfg.dropout, tuple(cfg.hidden), output_dim=output_dim, **own)


def build_model(spec: ModelSpec) -> nn.Module:
    """The network a spec describes, with fresh weights (a state_dict is loaded over them)."""
    return MODEL_KINDS.get(spec.kind).build_model(spec)


# The built-in kinds' two functions each (registered by name in models/builtin_kinds.py).


def mlp_fields(request: SpecRequest) -> dict[str, Any]:
    return {}


def mlp_network(spec: ModelSpec) -> nn.Module:
    return TabularMLP(spec.input_dim, list(spec.hidden), spec.dropout, spec.output_dim)


def transformer_fields(request: SpecRequest) -> dict[str, Any]:
    t = request.cfg.transformer
    layout = tuple(token_layout(list(request.feature_names)))
    return dict(transformer=TransformerShape(layout, t.d_model, t.heads, t.layers, t.mlp_hidden))


def transformer_network(spec: ModelSpec) -> nn.Module:
    t = _required(spec.transformer, spec)
    return TabularTransformer(
        list(t.layout), t.d_model, t.heads, t.layers, t.mlp_hidden, spec.dropout, spec.output_dim
    )


def custom_fields(request: SpecRequest) -> dict[str, Any]:
    cfg = request.cfg
    options = json.dumps(cfg.options, sort_keys=True)
    return dict(custom=CustomModel(str(cfg.factory), options, request.feature_names, request.task))


def custom_network(spec: ModelSpec) -> nn.Module:
    return build_custom(spec.input_dim, _required(spec.custom, spec))


def _required(part: T | None, spec: ModelSpec) -> T:
    if part is None:  # a spec.json edited by hand, or written for another kind
        raise ValueError(f"a model spec of kind {spec.kind!r} without its {spec.kind} part: {spec.to_json()}")
    return part
