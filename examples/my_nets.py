"""A user's own network for the pipeline (`model.kind: custom`):

    --set model.kind=custom --set model.factory=examples.my_nets:wide_and_deep

The factory gets the input spec (width, feature names), the task (what to output) and
`model.options`, and returns a plain torch module."""

from __future__ import annotations

import torch
from torch import nn


class WideAndDeep(nn.Module):
    """A linear ("wide") path plus a small MLP ("deep") path, summed (Cheng et al., 2016)."""

    def __init__(self, inputs: int, outputs: int, deep: list[int], dropout: float):
        super().__init__()
        self.wide = nn.Linear(inputs, outputs)
        layers: list[nn.Module] = []
        width = inputs
        for size in deep:
            layers += [nn.Linear(width, size), nn.GELU(), nn.Dropout(dropout)]
            width = size
        self.deep = nn.Sequential(*layers, nn.Linear(width, outputs))
        self.outputs = outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.wide(x) + self.deep(x)
        return out.squeeze(-1) if self.outputs == 1 else out  # [rows] for one output, as the task wants


def wide_and_deep(inputs, task, options) -> nn.Module:
    return WideAndDeep(
        inputs.dim, task.output_dim, list(options.get("deep", [128, 64])), float(options.get("dropout", 0.1))
    )
