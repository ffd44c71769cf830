"""What a training method is: a name (the value of `train.strategy`), its own config class (the
`train` section when it is chosen: shared keys plus its own, with its validators) and
`run(request) -> TrainOutcome`. The train stage looks the method up once and logs whatever it
returns the same way, so a new method is one module and one `register_method` call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.config.train import TRAIN_METHODS, TrainConfig
from sparkml_dist.launch.backend import DEFAULT_BACKEND
from sparkml_dist.launch.backends import get_backend
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.tasks.base import Target
from sparkml_dist.train.records import TrainOutcome

if TYPE_CHECKING:  # kept out of the import: choosing a method while reading a config needs none of them
    from pyspark.sql import SparkSession

    from sparkml_dist.data.dataset import PreprocessResult
    from sparkml_dist.launch.backend import Backend
    from sparkml_dist.train.adapters import AdaptSpec
    from sparkml_dist.train.job import EpochSink


@dataclass(frozen=True)
class LaunchNeeds:
    """What a method asks of the barrier launcher for a config: how many ranks, which backend
    (`launch.backends`, with its options) and whether each rank needs a freshly forked process.
    `ranks=0`: the method starts no barrier stage (it runs on the driver and ordinary Spark tasks)."""

    ranks: int
    backend: str = DEFAULT_BACKEND
    fresh_process: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def make_backend(self, device: str, timeout_s: int) -> Backend:
        return get_backend(
            self.backend, device, timeout_s, needs_fresh_process=self.fresh_process, **self.options
        )


@dataclass(frozen=True)
class WarmStart:
    """Start from a trained model instead of fresh weights (fine-tuning a registered version)."""

    spec: ModelSpec
    weights: bytes
    feature_pipeline: str | None
    training_schema: Mapping[str, str]
    target: Target  # the model's own: its classes and scale decide how the new rows are encoded
    adapt: AdaptSpec | None = None  # frozen prefixes and low-rank adapters


@dataclass(frozen=True)
class TrainRequest:
    """Everything a method gets to train with."""

    spark: SparkSession
    cfg: JobConfig
    data: PreprocessResult | None  # the preprocessed splits (a method may read raw rows instead)
    checkpoint_dir: str  # where it may keep checkpoints (a path or URI)
    sink: EpochSink | None = None  # give it each epoch's record as it completes (the stage logs them)
    warm_start: WarmStart | None = None
    label: str = ""  # names the run in its progress lines where several train at once ("trial 3")


# a method's own config class: the `train` section is validated as it when the method is chosen,
# so the method's `needs` and its placement are only ever called with one
MethodConfig = TypeVar("MethodConfig", bound=TrainConfig)


class TrainMethod(ABC, Generic[MethodConfig]):
    """A training method. Subclasses are frozen dataclasses (or plain classes) with these attributes."""

    name: str
    config: type[MethodConfig]
    summary: str = ""  # one line: what it is and when to use it
    supports_warm_start: ClassVar[bool] = False  # can start from a registered model (fine-tuning)

    @abstractmethod
    def needs(self, cfg: MethodConfig) -> LaunchNeeds:
        """What it asks of the launcher for this config."""

    @abstractmethod
    def run(self, request: TrainRequest) -> TrainOutcome:
        """Train and return the outcome; raise the library's typed errors."""


def register_method(method: TrainMethod[Any], *, replace: bool = False) -> TrainMethod[Any]:
    """Make `method` selectable as `train.strategy=<method.name>`. Its config class must subclass
    TrainConfig and declare `strategy: Literal["<name>"] = "<name>"`."""
    if not (isinstance(method.config, type) and issubclass(method.config, TrainConfig)):
        raise TypeError(f"training method {method.name!r}: config must be a subclass of TrainConfig")
    declared = method.config.model_fields["strategy"].default
    if declared != method.name:
        raise TypeError(
            f"training method {method.name!r}: its config class {method.config.__name__} must declare "
            f"strategy: Literal[{method.name!r}] = {method.name!r} (it says {declared!r})"
        )
    TRAIN_METHODS.register(method.name, method, replace=replace)
    return method


def get_method(name: str) -> TrainMethod[Any]:
    """The method registered as `train.strategy=<name>` (ConfigError listing the known ones if none)."""
    # the registry is typed by what the schema needs of an entry; register_method admits only TrainMethods
    return cast("TrainMethod[Any]", TRAIN_METHODS.get(name))


def method_names() -> list[str]:
    return TRAIN_METHODS.names()
