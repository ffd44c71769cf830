from sparkml_dist.models.factory import build_model, model_spec

__all__ = ["build_model", "model_spec"]
