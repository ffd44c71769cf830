"""A model kind defined outside the built-ins (tests/test_model_kinds.py): a linear layer over
the feature vector, described by no fields of its own."""

from __future__ import annotations

from torch import nn

from sparkml_dist.models.kinds import ModelKind


class Linear(nn.Module):
    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        self.output_dim = output_dim
        self.layer = nn.Linear(input_dim, output_dim)

    def forward(self, x):
        out = self.layer(x)
        return out.squeeze(-1) if self.output_dim == 1 else out


def linear_fields(request) -> dict:
    return {}


def linear_network(spec) -> nn.Module:
    return Linear(spec.input_dim, spec.output_dim)


LINEAR = ModelKind("linear", "toy_kind:linear_fields", "toy_kind:linear_network")
