"""The `train` section: the keys every training method shares (`TrainConfig`), and the registry
of methods (`train.strategy`) whose own config class the section is validated as."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from sparkml_dist.config.section import Section, error_at
from sparkml_dist.launch.backend import DEFAULT_BACKEND  # light: names only, no torch
from sparkml_dist.launch.backends import backend_names
from sparkml_dist.registry import Registry

if TYPE_CHECKING:
    from sparkml_dist.config.schema import JobConfig


class TrainConfig(Section):
    """Keys every training method shares. `strategy` picks the method, and with it the class
    this section is validated as (each method's own keys and checks live beside the method;
    see `sparkml_dist.methods`)."""

    # backends this method runs on; a method that also runs on Horovod widens it
    supported_backends: ClassVar[tuple[str, ...]] = (DEFAULT_BACKEND,)
    # can each rank take its own share of rows from the barrier stage (train.input=dataframe)?
    # Not where ranks of one model-parallel group must read the same rows.
    dataframe_input: ClassVar[bool] = True
    # can it continue at a smaller world size (train.min_ranks)? Data parallelism can; methods that
    # cut the model into a fixed number of pieces, or keep servers, cannot
    elastic: ClassVar[bool] = False
    # train.precision values it runs: fp16's gradient scaler must see every gradient a step
    # applies, which only a method whose ranks each hold whole gradients gives it
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "bf16")
    # can it capture its step in a CUDA graph (train.cuda_graph=on)?
    cuda_graphs: ClassVar[bool] = False

    strategy: str = Field(
        "ddp",
        description="the training method; built in: ddp, fsdp, tensor, pipeline, hybrid, "
        "async, federated (each adds its own keys below)",
    )
    backend: str = Field(
        DEFAULT_BACKEND,
        description="communication backend, a name in the backend registry: torch (torch.distributed), or "
        "horovod (Horovod AllReduce, data parallelism only)",
    )
    num_ranks: int = Field(2, ge=1, le=1024, description="ranks in the barrier stage (one Spark task each)")
    epochs: int = Field(8, ge=1, description="passes over the training split")
    batch_size: int = Field(256, ge=1, description="rows per optimizer step on each rank")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    seed: int = Field(42, description="initial weights, shuffling and dropout masks")
    shuffle_buffer_row_groups: int = Field(4, ge=1, description="row groups a rank shuffles together")
    timeout_s: int = Field(300, ge=5, description="collective / rendezvous timeout")
    checkpoint_keep: int = Field(2, ge=1, description="newest checkpoints kept")
    checkpoint_every_steps: int = Field(
        0, ge=0, description="also checkpoint every N optimizer steps (0: epoch ends only)"
    )
    input: Literal["parquet", "dataframe"] = Field(
        "parquet",
        description="how the train split reaches the ranks: parquet (each rank reads its rows from the "
        "preprocess output) or dataframe (Spark deals them through the barrier stage; no "
        "shared storage read for training rows)",
    )
    min_ranks: int | None = Field(
        None,
        ge=1,
        description="elastic: when train.num_ranks cannot all be placed within "
        "train.elastic_wait_s (a lost host), continue with fewer, at "
        "least this many, from the last checkpoint; a later attempt "
        "grows back. None: exactly num_ranks (ddp, fsdp)",
    )
    elastic_wait_s: float = Field(
        60.0,
        gt=0,
        description="how long a launch waits for train.num_ranks slots before an "
        "elastic run continues with fewer",
    )
    max_attempts: int = Field(
        3, ge=1, description="barrier-stage launches before giving up; each resumes from the last checkpoint"
    )
    straggler_factor: float = Field(
        1.5,
        gt=1.0,
        description="a rank whose median step time exceeds factor x the ranks' median is reported",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto", description="auto: the GPU Spark assigned the task, else CPU"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="the forward pass's precision: bf16 or fp16 autocast (weights, gradients and the "
        "optimizer stay fp32; fp16 adds a gradient scaler and needs a GPU; bf16 also runs on CPU)",
    )
    tf32: bool = Field(
        True,
        description="on CUDA: fp32 matmuls on TF32 tensor cores (torch's 'high' matmul "
        "precision) while training; scoring always uses full fp32",
    )
    cuda_graph: Literal["auto", "on", "off"] = Field(
        "auto",
        description="on a GPU, capture the whole training step in a CUDA graph and replay it (a tabular "
        "model's step is launch-bound: docs/gpu.md). auto: for one rank where the method, "
        "backend and precision allow it (ddp on torch.distributed, fp32 or bf16), falling back "
        "to eager steps if the model cannot be captured; on: also for several ranks (two graphs "
        "around an eager allreduce; not yet run on several GPUs), an error if it cannot; off: eager",
    )
    threads_per_rank: int = Field(0, ge=0, description="torch intra-op threads; 0 = cores / ranks")
    log_every_steps: int = Field(50, ge=1, description="rank 0 prints a progress line every N steps")
    loss: Literal["mse", "huber"] | None = Field(
        None,
        description="regression: mse (default) or huber on the "
        "standardised label; classifiers use cross-entropy",
    )
    class_weight: Literal["none", "balanced"] = Field(
        "none",
        description="classification: balanced weighs each class by rows / (classes x its rows) in the loss",
    )

    @field_validator("cuda_graph", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on/off as a boolean: `cuda_graph: on` means "on"
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("backend")
    @classmethod
    def _registered_backend(cls, name: str) -> str:
        # the registry is the launch layer's; reading it imports neither torch nor Horovod
        known = [f"'{n}'" for n in backend_names()]
        if name not in backend_names():
            raise PydanticCustomError(
                "unknown_backend",
                "Input should be {known} (a communication backend registered in sparkml_dist.launch.backends)",
                {"known": ", ".join(known[:-1]) + " or " + known[-1] if len(known) > 1 else known[0]},
            )
        return name

    @classmethod
    def backends(cls) -> tuple[str, ...]:
        """The backends this method runs on (ddp: every registered one)."""
        return cls.supported_backends

    @model_validator(mode="after")
    def _backend_is_supported(self) -> TrainConfig:
        if self.backend not in self.backends():
            raise ValueError(
                f"train.strategy={self.strategy} runs on {' or '.join(self.backends())}; Horovod "
                "does data parallelism only: set train.backend=torch or train.strategy=ddp"
            )
        if self.min_ranks is not None and (self.min_ranks > self.num_ranks or not self.elastic):
            raise ValueError(
                f"train.min_ranks={self.min_ranks}: must be at most train.num_ranks ({self.num_ranks}), "
                f"and train.strategy={self.strategy} "
                + ("can" if self.elastic else "cannot")
                + " change its world size (elastic training: ddp, fsdp)"
            )
        if self.precision not in self.precisions:
            raise ValueError(
                f"train.precision={self.precision} is not available with train.strategy={self.strategy} "
                f"(it runs {', '.join(self.precisions)}); fp16's loss scaling needs every rank to hold "
                f"whole gradients: use train.precision=bf16, or train.strategy=ddp"
            )
        if self.precision == "fp16" and self.device == "cpu":
            raise ValueError(
                "train.precision=fp16 needs a GPU (its gradient scaler is CUDA's); on CPU use "
                "train.precision=bf16"
            )
        if self.cuda_graph == "on" and (
            not self.cuda_graphs or self.device == "cpu" or self.precision == "fp16"
        ):
            raise ValueError(
                f"train.cuda_graph=on captures a data-parallel step on a GPU with torch.distributed, "
                f"in fp32 or bf16 (here: train.strategy={self.strategy}, train.backend={self.backend}, "
                f"train.device={self.device}, train.precision={self.precision}); set "
                f"train.cuda_graph=auto or off"
            )
        if self.input == "dataframe" and not self.dataframe_input:
            raise ValueError(
                f"train.input=dataframe deals each rank its own rows, but train.strategy={self.strategy} "
                f"needs ranks that share rows (or a different reader); use train.input=parquet, or "
                f"train.strategy=ddp or fsdp"
            )
        return self

    def check_job(self, job: JobConfig) -> None:
        """Checks across sections (the model this method can cut, the columns it needs); raise
        ValueError naming the keys. Methods override it beside their own keys."""


class TrainMethodEntry(Protocol):
    """What the schema needs of a registered training method (the full interface is
    `sparkml_dist.methods.TrainMethod`)."""

    name: str
    config: type[TrainConfig]


# train.strategy -> method. Kept beside TrainConfig because the `train` section's class is chosen
# from it; methods register into it (sparkml_dist.methods.register_method), the built-ins on first use.
TRAIN_METHODS: Registry[TrainMethodEntry] = Registry(
    "train.strategy", builtin_modules=("sparkml_dist.methods.builtin",)
)


def train_section(value: Any) -> TrainConfig:
    """The `train` section as its method's own config class."""
    if isinstance(value, TrainConfig):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError("train must be a mapping of keys (strategy, epochs, ...)")
    strategy = value.get("strategy", TrainConfig.model_fields["strategy"].default)
    if not isinstance(strategy, str) or strategy not in TRAIN_METHODS:
        raise error_at(
            ("strategy",),
            strategy,
            PydanticCustomError(
                "unknown_method",
                "unknown training method '{strategy}'; known: {known} (a new one is registered with "
                "sparkml_dist.register_method)",
                {"strategy": str(strategy), "known": ", ".join(TRAIN_METHODS.names())},
            ),
        )
    return TRAIN_METHODS.get(strategy).config.model_validate(value)
