"""Typed hand-offs between a rank, a training method and the train stage.

A rank program returns a `RankResult`; a training method returns a `TrainOutcome` (its epoch
records, per-rank stats, the trained model and how many launches it took); the train stage logs
and registers that, whatever the method. Records are honest about what they measured: an
evaluation says which rows it used (`val`: the validation split; `test`: the test rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.observe.system import SystemSample
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Evaluation, Target


@dataclass(frozen=True)
class RankThroughput:
    """One rank's pace in one epoch."""

    rank: int
    samples_per_s: float
    step_ms: float  # median time a step spent before its first collective (data + local work)
    # mean ms per step of each part (observe.steps.PHASES; "total": the whole step); no comm where
    # the parallelism's collectives run inside forward/backward and are not timed apart
    phases_ms: Mapping[str, float] = field(default_factory=dict)
    cpu_joules: float = math.nan  # this epoch's energy (observe.energy; nan: not measured)
    gpu_joules: float = 0.0
    cpu_seconds: float = math.nan  # the rank process's CPU time this epoch

    @property
    def joules(self) -> float:
        return self.cpu_joules + self.gpu_joules


@dataclass(frozen=True)
class EpochRecord:
    """One epoch (or federated round) of training, over all ranks."""

    epoch: int  # 0-based
    train_loss: float  # mean over the epoch's rows; nan where the method cannot know it
    samples: int  # rows trained on in this epoch, all ranks together
    samples_per_s: float
    evaluation: Evaluation | None = None
    stragglers: tuple[int, ...] = ()
    per_rank: tuple[RankThroughput, ...] = ()
    counters: Mapping[str, float] = field(default_factory=dict)  # the method's own, e.g. updates_dropped
    # every rank's system samples this epoch: logged as they come, not kept in checkpoints (so not
    # part of a record's equality: a resumed run's records equal the first run's)
    system: tuple[SystemSample, ...] = field(default=(), compare=False)
    energy_method: str = ""  # how the ranks' joules were had: observe.energy (nvml, rapl, estimate)

    @property
    def evaluated(self) -> Evaluation:
        """The held-out result of a method that evaluates every epoch (raises where none was made)."""
        if self.evaluation is None:
            raise ValueError(f"epoch {self.epoch + 1} has no held-out evaluation")
        return self.evaluation

    @property
    def joules(self) -> float:
        """Every rank's energy this epoch (nan where a rank did not measure it)."""
        return sum(r.joules for r in self.per_rank) if self.per_rank else math.nan

    def metrics(self) -> dict[str, float]:
        """The record as MLflow metrics (logged at step `epoch`)."""
        out = {
            "train_loss": self.train_loss,
            "samples": float(self.samples),
            "samples_per_s": self.samples_per_s,
            "stragglers": float(len(self.stragglers)),
        }
        if self.evaluation is not None:
            out.update(self.evaluation.metrics())
        for r in self.per_rank:
            out[f"samples_per_s_rank{r.rank}"] = r.samples_per_s
            out[f"step_time_ms_rank{r.rank}"] = r.step_ms
            out.update({f"step_{phase}_ms_rank{r.rank}": ms for phase, ms in r.phases_ms.items()})
            out[f"energy_joules_rank{r.rank}"] = r.joules
            out[f"cpu_seconds_rank{r.rank}"] = r.cpu_seconds
        out["energy_joules"] = self.joules
        out.update({k: float(v) for k, v in self.counters.items()})
        return {k: v for k, v in out.items() if not math.isnan(v)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"counters": dict(self.counters), "system": []}  # samples are logged, not kept

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> EpochRecord:
        evaluation = Evaluation(**raw["evaluation"]) if raw.get("evaluation") else None
        return EpochRecord(
            int(raw["epoch"]),
            float(raw["train_loss"]),
            int(raw["samples"]),
            float(raw["samples_per_s"]),
            evaluation,
            tuple(raw.get("stragglers", ())),
            tuple(RankThroughput(**r) for r in raw.get("per_rank", ())),
            dict(raw.get("counters", {})),
            (),
            raw.get("energy_method", ""),
        )


@dataclass(frozen=True)
class RankStats:
    """What one rank did over the whole run."""

    rank: int
    role: str = "trainer"  # async: server | worker; federated: client
    samples: int = 0  # rows this rank trained on per epoch
    steps: int = 0
    samples_per_s: float = 0.0
    step_ms: float = 0.0
    train_loss: float = math.nan  # mean over the rows this rank trained on (where the method has it per rank)
    param_bytes: int = 0  # parameters this rank held (a shard under model parallelism)
    param_checksum: tuple[float, ...] | None = None  # per-parameter sums; None: not a full replica

    def metrics(self) -> dict[str, float]:
        out = {f"param_bytes_rank{self.rank}": float(self.param_bytes)}
        if self.role == "worker":  # an asynchronous worker: its own pace, never in an epoch record
            out |= {
                f"samples_per_s_rank{self.rank}": self.samples_per_s,
                f"steps_rank{self.rank}": float(self.steps),
            }
        return out


@dataclass(frozen=True)
class RankResult:
    """What a rank program returns to the driver."""

    stats: RankStats
    records: tuple[EpochRecord, ...] = ()  # rank 0's are the run's
    weights: bytes | None = None  # rank 0: the full state_dict (models.weights codec)
    full_checksum: tuple[float, ...] | None = None  # rank 0: per-parameter sums of `weights`
    stragglers: tuple[int, ...] = ()
    counters: Mapping[str, Any] = field(default_factory=dict)  # a rank's own tallies (a parameter server's)
    # a method without per-epoch records (async): the rank's pace, step breakdown and energy over the
    # whole run, and its system samples, for the driver's one record
    pace: RankThroughput | None = None
    system: tuple[SystemSample, ...] = ()
    energy_method: str = ""

    @property
    def chief_weights(self) -> bytes:
        """Rank 0's full state_dict: the trained model (only rank 0's result carries it)."""
        if self.weights is None:
            raise RuntimeError(f"rank {self.stats.rank}'s result carries no weights; rank 0's does")
        return self.weights


@dataclass(frozen=True)
class TrainedModel:
    """Everything the model registry needs: rebuild, load, and score raw rows."""

    spec: ModelSpec
    weights: bytes
    feature_pipeline: str | None  # location of the fitted Spark ML pipeline that encodes raw rows
    training_schema: Mapping[str, str]  # column -> "type/role" it was trained on
    target: Target = UNRECORDED_TARGET  # what the outputs mean: task, classes or scale, threshold


@dataclass(frozen=True)
class TrainOutcome:
    """What a training method hands the train stage."""

    method: str
    model: TrainedModel
    records: tuple[EpochRecord, ...]
    ranks: tuple[RankStats, ...]
    attempts: int = 1  # barrier-stage launches it took
    stragglers: tuple[int, ...] = ()
    unit: str = "epoch"  # what one record is: an epoch, or a federated round
    detail: Any = None  # the method's own typed result, e.g. federated clients and payload checks
    world_sizes: tuple[int, ...] = ()  # ranks of each barrier-stage launch (elastic runs may shrink)
    epochs_per_record: int = 1  # async: its one record stands for every epoch of the run

    @property
    def ranks_in_step(self) -> bool:
        """Every rank holding a full replica ended with the same parameters."""
        replicas = [r.param_checksum for r in self.ranks if r.param_checksum is not None]
        return all(c == replicas[0] for c in replicas[1:])

    @property
    def last(self) -> EpochRecord:
        return self.records[-1]
