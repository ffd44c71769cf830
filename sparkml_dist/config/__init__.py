"""Typed job config: one schema, YAML files in conf/, `--set key=value` overrides."""

from sparkml_dist.config.loader import apply_overrides, load_config, parse_config
from sparkml_dist.config.schema import (
    ColumnSpec,
    CommunityConfig,
    DataConfig,
    FeatureConfig,
    FederatedConfig,
    FinetuneConfig,
    GateConfig,
    JobConfig,
    LabelSpec,
    ModelConfig,
    ObserveConfig,
    OutputConfig,
    SparkConfig,
    TrackingConfig,
    TransformerConfig,
)
from sparkml_dist.config.train import TRAIN_METHODS, TrainConfig

__all__ = [
    "TRAIN_METHODS",
    "ColumnSpec",
    "CommunityConfig",
    "DataConfig",
    "FeatureConfig",
    "FederatedConfig",
    "FinetuneConfig",
    "GateConfig",
    "JobConfig",
    "LabelSpec",
    "ModelConfig",
    "ObserveConfig",
    "OutputConfig",
    "SparkConfig",
    "TrackingConfig",
    "TrainConfig",
    "TransformerConfig",
    "apply_overrides",
    "load_config",
    "parse_config",
]
