"""train.strategy=async: parameter servers and asynchronous SGD (`wire.py`). Ranks
0..servers-1 hold the parameters; the others pull, compute and push without waiting for each
other, so a slow worker only makes its own updates staler. It is its own rank program
(`worker.async_rank`), launched in the same barrier stage and relaunched like the loop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sparkml_dist.config.train import TrainConfig
from sparkml_dist.errors import ConfigError
from sparkml_dist.methods.async_ps.config import AsyncConfig
from sparkml_dist.methods.base import LaunchNeeds, TrainMethod, TrainRequest, register_method
from sparkml_dist.methods.loop import make_job
from sparkml_dist.train.records import EpochRecord, RankResult, TrainedModel, TrainOutcome

if TYPE_CHECKING:
    from sparkml_dist.launch.relaunch import Launched


@dataclass(frozen=True)
class ParameterServerMethod(TrainMethod):
    name: str = "async"
    config: type[TrainConfig] = AsyncConfig
    summary: str = (
        "parameter servers + asynchronous SGD (`methods/async_ps/wire.py`): workers never wait for each other; "
        "stale updates dropped or down-weighted and counted"
    )

    def needs(self, cfg: TrainConfig) -> LaunchNeeds:
        # gloo and plain sockets, as ddp (AsyncConfig's only backend: torch)
        return LaunchNeeds(cfg.num_ranks, cfg.backend, fresh_process=False)

    def run(self, request: TrainRequest) -> TrainOutcome:
        # pyspark, torch: not while a config picks its method
        from sparkml_dist.launch.relaunch import run_with_relaunch
        from sparkml_dist.methods.async_ps.worker import async_rank

        if request.data is None:
            raise ConfigError("train.strategy=async trains on the preprocessed splits: run preprocess first")
        cfg = request.cfg.train
        job = make_job(request.cfg, request.data, request.checkpoint_dir)  # the rank program places the model
        needs = self.needs(cfg)
        launched = run_with_relaunch(
            request.spark,
            async_rank,
            lambda a: replace(job, attempt=a),
            needs.ranks,
            needs.make_backend(cfg.device, cfg.timeout_s),
            cfg.max_attempts,
            label=f"train async: {cfg.epochs} epochs",
        )
        record = final_record(launched, cfg.epochs)
        if request.sink is not None:
            request.sink(record)
        chief = launched.results[0]
        model = TrainedModel(
            job.model_spec,
            chief.chief_weights,
            request.data.feature_pipeline,
            request.data.manifest.schema,
            job.target,
        )
        return TrainOutcome(
            self.name,
            model,
            (record,),
            tuple(r.stats for r in launched.results),
            launched.attempts,
            epochs_per_record=cfg.epochs,
        )


def final_record(launched: Launched[RankResult], epochs: int) -> EpochRecord:
    """The run as one record (the workers keep no common epochs): their loss and pace, the chief's
    validation of the final parameters, the servers' tallies."""
    workers = [r.stats for r in launched.results if r.stats.role == "worker"]
    servers = [r.counters for r in launched.results if r.stats.role == "server"]
    samples = sum(w.samples for w in workers)  # rows per epoch, all workers
    counters = {
        "updates_applied": float(sum(s["applied"] for s in servers)),
        "updates_dropped": float(sum(s["dropped"] for s in servers)),
        "updates_downweighted": float(sum(s["downweighted"] for s in servers)),
        "staleness_mean": float(np.mean([s["staleness_mean"] for s in servers])),
        "staleness_max": float(max(s["staleness_max"] for s in servers)),
    }
    chief = launched.results[0].records[-1]
    ranks = launched.results
    return EpochRecord(
        epoch=epochs - 1,
        train_loss=sum(w.train_loss * w.samples for w in workers) / max(samples, 1),
        samples=samples,
        samples_per_s=sum(w.samples_per_s for w in workers),
        evaluation=chief.evaluation,
        counters=counters,
        per_rank=tuple(r.pace for r in ranks if r.pace is not None),
        system=tuple(s for r in ranks for s in r.system),
        energy_method=", ".join(sorted({r.energy_method for r in ranks if r.energy_method})),
    )


ASYNC = register_method(ParameterServerMethod())
