"""The model kinds by name (`model.kind`): one registry entry per network the product can build.

An entry is light (no torch): the config check, what it can do, and where its code lives as
'module:function' strings imported only when a model is described or built. A new kind is one
module with its two functions and one `MODEL_KINDS.register(ModelKind(...))`
(docs/architecture.md shows one); the built-ins register in `models/builtin_kinds.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkml_dist.registry import Registry, resolve

if TYPE_CHECKING:
    from torch import nn

    from sparkml_dist.config.schema import ModelConfig
    from sparkml_dist.models.spec import ModelSpec

__all__ = ["MODEL_KINDS", "ModelKind", "SpecRequest", "register_model_kind"]


@dataclass(frozen=True)
class SpecRequest:
    """What a kind describes its network from: the config, the input's width and feature names
    (in the stored order), the output's width and the task (`models.custom.TaskSpec`)."""

    cfg: ModelConfig
    input_dim: int
    feature_names: tuple[str, ...]
    output_dim: int
    task: Any


@dataclass(frozen=True)
class ModelKind:
    """One `model.kind`.

    `describe` ('module:function', `SpecRequest -> dict`) gives the kind's own `ModelSpec` fields
    (a transformer's shape, a custom model's factory); `build` ('module:function',
    `ModelSpec -> nn.Module`) rebuilds the network anywhere. `cuts_into_layers`: tensor, pipeline
    and hybrid can split it (their placements know its blocks). `user_code`: the network comes
    from the user's module (`model.factory`), which the job ships to the executors.
    `check(cfg)` raises ValueError naming the keys the kind needs or refuses."""

    name: str
    describe: str
    build: str
    cuts_into_layers: bool = False
    user_code: bool = False
    check: Callable[[ModelConfig], None] | None = None

    def spec_fields(self, request: SpecRequest) -> dict[str, Any]:
        return resolve(self.describe)(request)

    def build_model(self, spec: ModelSpec) -> nn.Module:
        return resolve(self.build)(spec)


MODEL_KINDS: Registry[ModelKind] = Registry(
    "model.kind", builtin_modules=("sparkml_dist.models.builtin_kinds",)
)


def register_model_kind(kind: ModelKind, *, replace: bool = False) -> ModelKind:
    """Make `kind` a `model.kind` value (its functions are imported where a network is built)."""
    return MODEL_KINDS.register(kind.name, kind, replace=replace)


def kinds_that_cut_into_layers() -> list[str]:
    return [name for name, kind in MODEL_KINDS if kind.cuts_into_layers]
