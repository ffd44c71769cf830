"""Losses over packed targets. A batch's target is a [rows, 2] float tensor: the encoded label
and the row's weight (the sample weight, 1 without `data.weight_column`; 0 for padding rows).
Class weights multiply in per label. `forward` is the weighted mean over the batch; a pipeline
schedule, which averages micro-batches itself, uses `weighted_sum` on pre-scaled weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TargetLoss(nn.Module):
    class_weights: torch.Tensor  # a buffer (register_buffer), declared for the type checker

    def __init__(self, class_weights: tuple[float, ...] | None = None):
        super().__init__()
        self.register_buffer(
            "class_weights",
            torch.tensor(class_weights, dtype=torch.float32) if class_weights else torch.empty(0),
            persistent=False,
        )

    def per_row(self, outputs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, target: torch.Tensor) -> torch.Tensor:
        w = target[:, 1]
        if self.class_weights.numel():
            w = w * self.class_weights.to(w.device)[target[:, 0].long()]
        return w

    def weighted_sum(self, outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (self.per_row(outputs, target[:, 0]) * self.weights(target)).sum()

    def forward(self, outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # clamp: an idle step's all-zero weights give 0, not 0/0
        return self.weighted_sum(outputs, target) / self.weights(target).sum().clamp_min(1e-12)


class BinaryLoss(TargetLoss):
    def per_row(self, outputs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, label, reduction="none")


class MulticlassLoss(TargetLoss):
    def per_row(self, outputs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, label.long(), reduction="none")


class RegressionLoss(TargetLoss):
    """On the standardised label: the network predicts (y - mean) / std."""

    def __init__(self, mean: float, std: float, kind: str = "mse"):
        super().__init__(None)
        self.mean, self.std, self.kind = mean, std, kind

    def per_row(self, outputs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        z = (label - self.mean) / self.std
        if self.kind == "huber":
            return F.huber_loss(outputs, z, reduction="none", delta=1.0)
        return (outputs - z) ** 2
