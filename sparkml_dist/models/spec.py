"""The model spec: a small JSON-able description from which a model is rebuilt anywhere (a rank,
an executor, a serving process) before its state_dict is loaded. Its JSON form is the
`spec.json` inside every logged model, so models logged by earlier versions still load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkml_dist.models.custom import CustomModel


@dataclass(frozen=True)
class TransformerShape:
    """The tabular transformer's shape: `layout` maps every feature slot to its token."""

    layout: tuple[int, ...]
    d_model: int
    heads: int
    layers: int
    mlp_hidden: int

    @property
    def tokens(self) -> int:
        """Tokens a row becomes, the [CLS] token included."""
        return max(self.layout) + 2


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # a name in models.kinds.MODEL_KINDS
    input_dim: int
    dropout: float = 0.0
    hidden: tuple[int, ...] = ()  # mlp: hidden widths
    transformer: TransformerShape | None = None  # transformer only
    output_dim: int = 1  # one logit (binary), one per class (multiclass), one value (regression)
    custom: CustomModel | None = None  # custom only: the factory, its options and what it is called with

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "input_dim": self.input_dim,
            "hidden": list(self.hidden),
            "dropout": self.dropout,
            "output_dim": self.output_dim,
        }
        if self.transformer is not None:
            t = self.transformer
            out.update(
                layout=list(t.layout),
                d_model=t.d_model,
                heads=t.heads,
                layers=t.layers,
                mlp_hidden=t.mlp_hidden,
            )
        if self.custom is not None:
            out["custom"] = self.custom.to_json()
        return out

    @staticmethod
    def from_json(raw: dict[str, Any]) -> ModelSpec:
        shape = None
        if "layout" in raw:
            shape = TransformerShape(
                tuple(raw["layout"]), raw["d_model"], raw["heads"], raw["layers"], raw["mlp_hidden"]
            )
        output_dim = int(raw.get("output_dim", 1))
        own = raw.get("custom")  # the custom kind's part of the JSON (models/kinds.py)
        custom = CustomModel.from_json(own, output_dim) if own is not None else None
        return ModelSpec(
            raw["kind"],
            int(raw["input_dim"]),
            float(raw.get("dropout", 0.0)),
            tuple(raw.get("hidden", ())),
            shape,
            output_dim,
            custom,
        )
