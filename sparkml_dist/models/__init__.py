"""Models: rebuilt from a `ModelSpec` (`spec`) by `factory.build_model`; weights are state_dicts
(the codec in `weights`). This package init imports nothing heavy: a spec is read without torch."""

from sparkml_dist.models.spec import ModelSpec, TransformerShape

__all__ = ["ModelSpec", "TransformerShape"]
