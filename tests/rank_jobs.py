"""The rank loop's payload for a config, for tests that run one rank in this process (no Spark
stage): placed by `cfg.train.strategy`'s method, as the train stage places it."""

from __future__ import annotations

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import PreprocessResult
from sparkml_dist.errors import ConfigError
from sparkml_dist.methods import LoopMethod, WarmStart, get_method, make_job
from sparkml_dist.train.job import EpochSink, TrainJob


def loop_job(
    cfg: JobConfig,
    data: PreprocessResult,
    checkpoint_dir: str,
    sink: EpochSink | None = None,
    warm_start: WarmStart | None = None,
) -> TrainJob:
    """The rank loop's payload, placed by `cfg.train.strategy`'s method."""
    return make_job(
        cfg,
        data,
        checkpoint_dir,
        placement=loop_method(cfg.train.strategy).placement,
        sink=sink,
        warm_start=warm_start,
    )


def loop_method(name: str) -> LoopMethod:
    method = get_method(name)
    if not isinstance(method, LoopMethod):
        raise ConfigError(f"train.strategy={name} does not run in the rank loop (it has its own program)")
    return method
