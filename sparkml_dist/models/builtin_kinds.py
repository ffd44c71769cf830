"""The built-in model kinds, registered on the first lookup of `model.kind` (no torch here: the
networks' code is named, and imported only where a model is described or built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkml_dist.models.kinds import MODEL_KINDS, ModelKind

if TYPE_CHECKING:
    from sparkml_dist.config.schema import ModelConfig

_FACTORY = "sparkml_dist.models.factory"


def _needs_a_factory(cfg: ModelConfig) -> None:
    if not cfg.factory:
        raise ValueError(f"model.kind={cfg.kind} needs model.factory: 'package.module:function'")


MODEL_KINDS.register("mlp", ModelKind("mlp", f"{_FACTORY}:mlp_fields", f"{_FACTORY}:mlp_network"))
MODEL_KINDS.register(
    "transformer",
    ModelKind(
        "transformer",
        f"{_FACTORY}:transformer_fields",
        f"{_FACTORY}:transformer_network",
        cuts_into_layers=True,
    ),
)
MODEL_KINDS.register(
    "custom",
    ModelKind(
        "custom",
        f"{_FACTORY}:custom_fields",
        f"{_FACTORY}:custom_network",
        user_code=True,
        check=_needs_a_factory,
    ),
)
