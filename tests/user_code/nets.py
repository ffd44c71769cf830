"""A user's own networks for `model.kind: custom` (factories: (InputSpec, TaskSpec, options) -> nn.Module)."""

from __future__ import annotations

import torch
from torch import nn


class ResidualMLP(nn.Module):
    """LayerNorm'd residual blocks over the feature vector; nothing like the project's own MLP."""

    def __init__(self, dim: int, width: int, blocks: int, outputs: int):
        super().__init__()
        self.stem = nn.Linear(dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(blocks)
        )
        self.head = nn.Linear(width, outputs)
        self.outputs = outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        out = self.head(h)
        return out.squeeze(-1) if self.outputs == 1 else out


def residual_mlp(inputs, task, options):
    return ResidualMLP(
        inputs.dim, int(options.get("width", 64)), int(options.get("blocks", 2)), task.output_dim
    )


def wrong_shape(inputs, task, options):
    return nn.Linear(inputs.dim, task.output_dim + 2)


def not_a_module(inputs, task, options):
    return "a string"
