"""Fine-tuning adapters: freeze parameters by name prefix, add low-rank adapters (LoRA) to
Linear layers, and merge the adapters back so the exported model has the base model's spec
and parameter names (scoring needs nothing new).

LoRA: y = W x + b + (alpha / r) * B (A x), with W, b frozen, A small random, B zero, so
training starts exactly at the base model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class AdaptSpec:
    freeze: tuple[str, ...] = ()  # parameter-name prefixes kept fixed
    lora_rank: int = 0  # > 0: adapters on every Linear; the base weights are frozen
    lora_alpha: float = 8.0
    lora_targets: tuple[str, ...] = field(default_factory=tuple)  # module-name prefixes; empty = all Linear


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        for p in base.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            self.base.weight += (self.lora_b @ self.lora_a) * self.scale
        return self.base


def apply_adapters(model: nn.Module, spec: AdaptSpec) -> nn.Module:
    """Freeze and/or wrap in place; returns the model. Unknown prefixes are errors."""
    names = [n for n, _ in model.named_parameters()]
    unknown = [p for p in spec.freeze if not any(n.startswith(p) for n in names)]
    if unknown:
        raise ValueError(f"finetune.freeze: no parameter starts with {unknown}; parameters are {names}")
    for name, param in model.named_parameters():
        if any(name.startswith(p) for p in spec.freeze):
            param.requires_grad_(False)
    if spec.lora_rank > 0:
        for name, module in list(model.named_modules()):
            if isinstance(module, nn.Linear) and (
                not spec.lora_targets or name.startswith(spec.lora_targets)
            ):
                _replace(model, name, LoRALinear(module, spec.lora_rank, spec.lora_alpha))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "finetune: every parameter is frozen; freeze fewer prefixes or set finetune.lora_rank"
        )
    return model


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold every LoRALinear back into a plain Linear (in place); the base names return."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            _replace(model, name, module.merged())
    for param in model.parameters():
        param.requires_grad_(True)
    return model


def trainable(params) -> list[nn.Parameter]:
    return [p for p in params if p.requires_grad]


def _replace(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
