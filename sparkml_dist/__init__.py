"""sparkml_dist: the distributed ML lifecycle on Apache Spark.

The public API is what this module exports; every other module is internal and may change
(docs/architecture.md says which is which):

    import sparkml_dist as sd

    cfg = sd.load_config("conf/adult.yaml", ["train.epochs=3"])
    spark = sd.build_session(cfg.spark)
    summary = sd.run_pipeline(spark, cfg)               # or the stages one by one:
    prep = sd.preprocess(spark, cfg)                    # sd.train, sd.evaluate, sd.register, sd.score
    results = sd.run_barrier(spark, my_rank_fn, payload, 2, sd.get_backend("torch"))
    model = sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(my_train, 1e-3)

Names are imported on first use, so `import sparkml_dist` does not start Spark or import torch.
"""

from __future__ import annotations

from sparkml_dist.exports import lazy_getattr

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # configuration
    "load_config": "sparkml_dist.config.loader",
    "parse_config": "sparkml_dist.config.loader",
    "JobConfig": "sparkml_dist.config.schema",
    "TrainConfig": "sparkml_dist.config.train",
    "Section": "sparkml_dist.config.section",
    # Spark
    "build_session": "sparkml_dist.spark.session",
    # stages and the pipeline
    "preprocess": "sparkml_dist.stages.preprocess",
    "train": "sparkml_dist.stages.train",
    "evaluate": "sparkml_dist.stages.evaluate",
    "register": "sparkml_dist.stages.register",
    "score": "sparkml_dist.stages.score",
    "finetune": "sparkml_dist.stages.finetune",
    "contribute": "sparkml_dist.stages.contribute",
    "run_pipeline": "sparkml_dist.pipeline",
    "run_tune": "sparkml_dist.tune.runner",
    "stream": "sparkml_dist.stages.stream",
    "StreamResult": "sparkml_dist.stages.stream",
    "TuneResult": "sparkml_dist.tune.runner",
    "PreprocessResult": "sparkml_dist.data.dataset",
    "TrainResult": "sparkml_dist.stages.train",
    "Summary": "sparkml_dist.pipeline",
    # tracking
    "start_run": "sparkml_dist.tracking.client",
    "end_run": "sparkml_dist.tracking.client",
    "tracked_run": "sparkml_dist.tracking.client",
    "RunHandle": "sparkml_dist.tracking.client",
    # the launcher
    "run_barrier": "sparkml_dist.launch.launcher",
    "run_with_relaunch": "sparkml_dist.launch.relaunch",
    "get_backend": "sparkml_dist.launch.backends",
    "register_backend": "sparkml_dist.launch.backends",
    "BackendSpec": "sparkml_dist.launch.backends",
    "RankContext": "sparkml_dist.launch.context",
    # your own torch code on the ranks (a drop-in for pyspark's TorchDistributor)
    "TorchDistributor": "sparkml_dist.distributor.api",
    "dataframe_loader": "sparkml_dist.distributor.frames",
    "launch_info": "sparkml_dist.distributor.job",
    "LaunchInfo": "sparkml_dist.distributor.job",
    "InputSpec": "sparkml_dist.models.custom",
    "TaskSpec": "sparkml_dist.models.custom",
    # training methods
    "TrainMethod": "sparkml_dist.methods.base",
    "TrainRequest": "sparkml_dist.methods.base",
    "LaunchNeeds": "sparkml_dist.methods.base",
    "register_method": "sparkml_dist.methods.base",
    "get_method": "sparkml_dist.methods.base",
    "LoopMethod": "sparkml_dist.methods.loop",
    "Parallelism": "sparkml_dist.train.parallelism",
    "TrainOutcome": "sparkml_dist.train.records",
    "EpochRecord": "sparkml_dist.train.records",
    "Evaluation": "sparkml_dist.train.records",
    "RankStats": "sparkml_dist.train.records",
    "RankResult": "sparkml_dist.train.records",
    "TrainedModel": "sparkml_dist.train.records",
    "ModelSpec": "sparkml_dist.models.spec",
    # model kinds and input sources
    "register_model_kind": "sparkml_dist.models.kinds",
    "ModelKind": "sparkml_dist.models.kinds",
    "register_source_format": "sparkml_dist.data.formats",
    "SourceFormat": "sparkml_dist.data.formats",
    # tasks
    "Task": "sparkml_dist.tasks.base",
    "Target": "sparkml_dist.tasks.base",
    "TaskReport": "sparkml_dist.tasks.base",
    "register_task": "sparkml_dist.tasks.base",
    "get_task": "sparkml_dist.tasks.base",
    # storage
    "register_scheme": "sparkml_dist.storage.store",
    "Scheme": "sparkml_dist.storage.store",
    # errors
    "SparkMLDistError": "sparkml_dist.errors",
    "ConfigError": "sparkml_dist.errors",
    "DataError": "sparkml_dist.errors",
    "StorageError": "sparkml_dist.errors",
    "UserCodeError": "sparkml_dist.errors",
    "SlotError": "sparkml_dist.errors",
    "RankFailure": "sparkml_dist.errors",
    "RendezvousError": "sparkml_dist.errors",
    "TrainingFailed": "sparkml_dist.errors",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 -- a list; the names resolve lazily (__getattr__)


__getattr__ = lazy_getattr("sparkml_dist", _EXPORTS, globals())
