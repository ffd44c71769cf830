"""The picklable description of one training run, sent to every rank."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sparkml_dist.config.schema import ObserveConfig
from sparkml_dist.config.train import TrainConfig
from sparkml_dist.data.dataset import RowGroup
from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.data.loader import FrameShardLoader, ShardLoader, feature_columns
from sparkml_dist.launch.context import PartitionData
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Target
from sparkml_dist.train.adapters import AdaptSpec
from sparkml_dist.train.records import EpochRecord

if TYPE_CHECKING:
    from sparkml_dist.train.parallelism import Parallelism

# How a method places the model on the ranks: (its train config, world size, rank) -> Parallelism.
# A module-level function, so that it travels to the ranks by reference.
# (the method's own config, world size, rank) -> the rank's Parallelism; the `train` section is
# validated as that method's config class, so a placement may ask for its subclass of TrainConfig
Placement = Callable[[Any, int, int], "Parallelism"]


class OpenSink(Protocol):
    def __call__(self, record: EpochRecord) -> bool | None: ...  # True: stop training after this epoch

    def close(self) -> None: ...


class EpochSink(Protocol):
    """Where each epoch's record goes as it completes (`tracking.client.EpochLogger`): a method on
    the driver calls it; rank 0 of a barrier stage `open()`s it first and `close()`s it at the end.
    A sink whose `may_stop` is true may answer True (a pruned tuning trial): every rank then ends
    training after that epoch, with the epochs done so far."""

    @property
    def may_stop(self) -> bool: ...

    def __call__(self, record: EpochRecord) -> bool | None: ...

    def open(self) -> OpenSink: ...


@dataclass(frozen=True)
class Fault:
    """A deliberate failure for chaos tests: on `attempt`, when `rank` reaches (epoch, step),
    `kill` SIGKILLs the rank's process; `hang` stops it there for `seconds` (default an hour);
    `slow` sleeps `seconds` before every step of that rank."""

    rank: int
    kind: str = "kill"  # kill | hang | slow
    epoch: int = 0
    step: int = 0
    attempt: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class TrainJob:
    data_root: str  # the preprocess output (a path or URI, see sparkml_dist.storage)
    train_groups: tuple[RowGroup, ...]
    val_groups: tuple[RowGroup, ...]
    model_spec: ModelSpec
    train: TrainConfig
    checkpoint_dir: str
    placement: Placement | None = None  # None: the rank program places the model itself (async)
    sink: EpochSink | None = None  # rank 0 hands it each epoch's record (the stage's MLflow logging)
    attempt: int = 0
    faults: tuple[Fault, ...] = ()
    init_weights: bytes | None = None  # fine-tuning: the base model's state_dict (models.weights codec)
    adapt: AdaptSpec | None = None  # fine-tuning: frozen prefixes and low-rank adapters
    feature_layout: FeatureLayout | None = None  # how the splits store features (None: dense column)
    target: Target = UNRECORDED_TARGET  # what the label is: the loss and the per-epoch metric follow it
    class_weights: tuple[float, ...] | None = None  # per class, multiplied into each row's weight
    weighted: bool = False  # the splits carry a weight per row
    frame_fed: bool = False  # train.input=dataframe: the train rows arrive with the barrier stage
    checkpoint_key: bytes = b""  # signs and verifies sharded checkpoints (train.parallel.signing)
    observe: ObserveConfig = ObserveConfig()  # system metrics, step breakdown, energy (sparkml_dist.observe)
    label: str = ""  # prefixes rank 0's progress lines where several runs train at once ("trial 3")

    def training_columns(self) -> list[str]:
        """What a rank reads of the train split (the columns a dealt DataFrame must carry)."""
        return [*feature_columns(self.feature_layout), "label", *(["weight"] if self.weighted else [])]

    def loss(self):
        """The task's loss for this target (a module; every rank builds its own)."""
        return self.target.kind.loss(self.target, self.class_weights, self.train.loss)

    def loader(
        self,
        split: str,
        rank: int,
        world: int,
        batch_size: int,
        seed: int,
        partition: PartitionData | None = None,
        **options,
    ) -> ShardLoader | FrameShardLoader:
        """A rank's streaming reader over the `split` ("train" or "val") row groups, or, for a
        frame-fed job's train split, over the share the barrier task spilled (`partition`)."""
        if split == "train" and self.frame_fed:
            if partition is None:
                raise RuntimeError(
                    "train.input=dataframe, but this rank was not launched over the train split"
                )
            return FrameShardLoader(
                partition.path,
                rank,
                batch_size,
                seed,
                options.get("shuffle", True),
                self.feature_layout,
                self.weighted,
                options.get("dense", True),
            )
        groups = self.train_groups if split == "train" else self.val_groups
        return ShardLoader(
            self.data_root,
            list(groups),
            rank,
            world,
            batch_size,
            seed,
            layout=self.feature_layout,
            weighted=self.weighted,
            **options,
        )
