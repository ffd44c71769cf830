"""Typed job config: one schema, YAML files in conf/, `--set key=value` overrides."""

from sparkml_dist.config.loader import apply_overrides, load_config, parse_config
from sparkml_dist.config.schema import (
    ColumnSpec,
    DataConfig,
    FeatureConfig,
    GateConfig,
    HorovodConfig,
    JobConfig,
    LabelSpec,
    ModelConfig,
    OutputConfig,
    SparkConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "ColumnSpec", "DataConfig", "FeatureConfig", "GateConfig", "HorovodConfig", "JobConfig", "LabelSpec",
    "ModelConfig", "OutputConfig", "SparkConfig", "TrackingConfig", "TrainConfig",
    "apply_overrides", "load_config", "parse_config",
]
