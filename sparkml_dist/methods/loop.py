"""Methods that run inside the one rank loop (`train.loop.train_rank`) and differ only in how
they place the model on the ranks: a `Parallelism` (DDP, Horovod, FSDP, tensor, pipeline, hybrid).
The loop is launched in one barrier stage and relaunched from the last checkpoint on failure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, cast

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.errors import ConfigError
from sparkml_dist.methods.base import LaunchNeeds, MethodConfig, TrainMethod, TrainRequest, WarmStart
from sparkml_dist.models.custom import check_custom_model, task_spec
from sparkml_dist.train.records import TrainedModel, TrainOutcome

# Heavy modules (torch, Spark) are imported where a method runs, not where it is registered:
# reading a config picks the method's config class and nothing more.
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkml_dist.data.dataset import PreprocessResult
    from sparkml_dist.launch.relaunch import Launched
    from sparkml_dist.train.job import EpochSink, Placement, TrainJob
    from sparkml_dist.train.parallelism import Parallelism
    from sparkml_dist.train.records import RankResult


@dataclass(frozen=True)
class LoopMethod(TrainMethod[MethodConfig]):
    name: str
    config: type[MethodConfig]
    # module-level (cfg, world, rank) -> Parallelism: it travels to the ranks
    placement: Callable[[MethodConfig, int, int], Parallelism]
    summary: str = ""
    # fork a fresh process per rank: DTensor / DCP keep process-wide caches keyed by the mesh's
    # shape, which a reused Spark worker would hit when it now holds another rank
    fresh_process: bool = True
    supports_warm_start: ClassVar[bool] = True

    def needs(self, cfg: MethodConfig) -> LaunchNeeds:
        return LaunchNeeds(cfg.num_ranks, cfg.backend, self.fresh_process)

    def run(self, request: TrainRequest) -> TrainOutcome:
        if request.data is None:
            raise ConfigError(
                f"train.strategy={self.name} trains on the preprocessed splits: run preprocess first"
            )
        job = make_job(
            request.cfg,
            request.data,
            request.checkpoint_dir,
            placement=self.placement,
            sink=request.sink,
            warm_start=request.warm_start,
            label=request.label,
        )
        launched = self.launch(request.spark, job)
        warm = request.warm_start
        chief = launched.results[0]
        model = TrainedModel(
            job.model_spec,
            chief.chief_weights,
            warm.feature_pipeline if warm else request.data.feature_pipeline,
            warm.training_schema if warm else request.data.manifest.schema,
            job.target,
        )
        return TrainOutcome(
            self.name,
            model,
            chief.records,
            tuple(r.stats for r in launched.results),
            launched.attempts,
            chief.stragglers,
            world_sizes=launched.world_sizes,
        )

    def launch(self, spark: SparkSession, job: TrainJob) -> Launched[RankResult]:
        """`train_rank` on `job.train.num_ranks` ranks, relaunched from the last checkpoint on failure."""
        # pyspark, torch: not while a config picks its method
        from sparkml_dist.launch.relaunch import run_with_relaunch
        from sparkml_dist.train.loop import train_rank

        cfg = job.train
        needs = self.needs(cast(MethodConfig, cfg))  # the train section is validated as this method's config
        frame = training_frame(spark, job) if job.frame_fed else None
        return run_with_relaunch(
            spark,
            train_rank,
            lambda attempt: replace(job, attempt=attempt),
            needs.ranks,
            needs.make_backend(cfg.device, cfg.timeout_s),
            cfg.max_attempts,
            frame=frame,
            min_ranks=cfg.min_ranks,
            elastic_wait_s=cfg.elastic_wait_s,
            label=f"train {self.name}: {cfg.epochs} epochs",
        )


def make_job(
    cfg: JobConfig,
    data: PreprocessResult,
    checkpoint_dir: str,
    *,
    placement: Placement | None = None,
    sink: EpochSink | None = None,
    warm_start: WarmStart | None = None,
    label: str = "",
) -> TrainJob:
    """A rank program's payload for `cfg` on `data`: the model for the data's target (or the
    fine-tuned model's), the target, its class weights."""
    # torch, pyarrow: not while a config picks its method
    from sparkml_dist.data.layout import FeatureLayout
    from sparkml_dist.models.factory import model_spec
    from sparkml_dist.train.job import TrainJob
    from sparkml_dist.train.parallel.signing import checkpoint_key

    manifest = data.manifest
    target = warm_start.target if warm_start else manifest.target_spec
    spec = (
        warm_start.spec
        if warm_start
        else model_spec(
            cfg.model,
            manifest.feature_dim,
            manifest.feature_names,
            target.kind.output_dim(target),
            task_spec(target),
        )
    )
    if spec.custom is not None:  # the user's network: its output shape checked before any rank starts
        check_custom_model(spec.input_dim, spec.custom)
    return TrainJob(
        data_root=data.path,
        train_groups=tuple(manifest.splits["train"].row_groups),
        val_groups=tuple(manifest.splits["val"].row_groups),
        model_spec=spec,
        train=cfg.train,
        observe=cfg.observe,
        checkpoint_dir=checkpoint_dir,
        placement=placement,
        sink=sink,
        init_weights=warm_start.weights if warm_start else None,
        adapt=warm_start.adapt if warm_start else None,
        feature_layout=FeatureLayout.from_json(manifest.feature_layout),
        target=target,
        class_weights=target.balanced_weights() if cfg.train.class_weight == "balanced" else None,
        weighted=manifest.weighted,
        frame_fed=cfg.train.input == "dataframe",
        checkpoint_key=checkpoint_key(checkpoint_dir),
        label=label,
    )


def training_frame(spark: SparkSession, job: TrainJob):
    """`train.input: dataframe`: the train split's rows (the files the manifest lists, the columns
    a rank reads) as a DataFrame the barrier stage deals to the ranks."""
    from sparkml_dist import storage  # pyarrow: not while a config picks its method

    files = sorted({group.file for group in job.train_groups})
    paths = [storage.spark_path(storage.join(job.data_root, f)) for f in files]
    return spark.read.parquet(*paths).select(*job.training_columns())
