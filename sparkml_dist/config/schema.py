"""The job config schema. Validated once, at the edge; unknown keys are errors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ColumnType = Literal["int", "double", "string"]
ColumnRole = Literal["numeric", "categorical", "label", "id", "ignore"]


class ColumnSpec(_Strict):
    name: str = Field(min_length=1)
    type: ColumnType
    role: ColumnRole


class LabelSpec(_Strict):
    column: str
    positive: str = Field(description="raw value of the positive class")
    negative: str = Field(description="raw value of the negative class")
    strip_suffix: str = Field("", description="suffix removed before matching, e.g. '.'")


class DataConfig(_Strict):
    train_path: str = Field(description="CSV file(s) for training; pkg://<package>/<file> reads a file shipped in an installed package")
    test_path: str
    score_path: str | None = Field(None, description="raw rows to score; defaults to test_path")
    header: bool = False
    delimiter: str = Field(",", min_length=1, max_length=1)
    null_values: list[str] = ["?"]
    columns: list[ColumnSpec] = Field(min_length=2)
    label: LabelSpec
    validation_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    split_seed: int = 7
    files_per_rank: int = Field(2, ge=1, le=64)
    row_group_rows: int = Field(2048, ge=64)

    @model_validator(mode="after")
    def _roles_are_consistent(self) -> DataConfig:
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"column names must be unique; repeated: {dupes}")
        labels = [c.name for c in self.columns if c.role == "label"]
        if labels != [self.label.column]:
            raise ValueError(
                f"exactly one column must have role 'label' and be label.column "
                f"('{self.label.column}'); found role 'label' on {labels}"
            )
        for c in self.columns:
            if c.role == "numeric" and c.type == "string":
                raise ValueError(f"column '{c.name}' has role 'numeric' but type 'string'; use int or double")
        if not any(c.role in ("numeric", "categorical") for c in self.columns):
            raise ValueError("no feature columns: give at least one column role 'numeric' or 'categorical'")
        return self

    def names_with_role(self, role: ColumnRole) -> list[str]:
        return [c.name for c in self.columns if c.role == role]


class FeatureConfig(_Strict):
    impute_strategy: Literal["median", "mean"] = "median"
    scale_numeric: bool = True
    one_hot: bool = True


class TransformerConfig(_Strict):
    """The tabular transformer (model.kind=transformer): one token per source column."""

    d_model: int = Field(32, ge=4)
    heads: int = Field(4, ge=1)
    layers: int = Field(2, ge=1)
    mlp_hidden: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.d_model % self.heads:
            raise ValueError(f"model.transformer.d_model ({self.d_model}) must be divisible by "
                             f"model.transformer.heads ({self.heads})")
        return self


class ModelConfig(_Strict):
    kind: Literal["mlp", "transformer"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [128, 64], min_length=1, description="mlp hidden widths")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    transformer: TransformerConfig = TransformerConfig()


class HorovodConfig(_Strict):
    """Options of the Horovod backend. What Horovod on CPU/Gloo cannot do is refused here."""

    compression: Literal["none", "fp16", "bf16"] = "none"
    backward_passes_per_step: int = Field(1, ge=1, description="gradient accumulation before each allreduce")
    reduce_op: Literal["average", "adasum"] = "average"
    sync_batch_norm: bool = False
    cycle_time_ms: float = Field(1.0, gt=0.0, le=100.0, description="HOROVOD_CYCLE_TIME: background loop period")
    fusion_threshold_mib: int = Field(64, ge=0, description="HOROVOD_FUSION_THRESHOLD: tensor fusion buffer size")


class ParallelConfig(_Strict):
    """Options of the model-parallel strategies (train.strategy fsdp | pipeline | tensor | hybrid)."""

    tensor_parallel: int = Field(2, ge=1, description="hybrid: ranks per tensor-parallel group (data parallel = num_ranks / this)")
    microbatches: int = Field(4, ge=1, description="pipeline: micro-batches per batch")
    schedule: Literal["gpipe", "1f1b"] = "1f1b"


Strategy = Literal["ddp", "fsdp", "pipeline", "tensor", "hybrid", "async", "federated"]


class AsyncConfig(_Strict):
    """train.strategy=async: parameter servers and asynchronous SGD over torch RPC."""

    servers: int = Field(1, ge=1, description="ranks 0..servers-1 hold the parameters (sharded by name); the rest are workers")
    max_staleness: int = Field(4, ge=0, description="an update computed on parameters this many versions old or older is stale")
    stale_policy: Literal["drop", "downweight"] = Field("drop", description="drop a too-stale update, or scale it by 1/(1+staleness)")


class TrainConfig(_Strict):
    backend: Literal["torch", "horovod"] = "torch"
    strategy: Strategy = "ddp"
    num_ranks: int = Field(2, ge=1, le=1024)
    epochs: int = Field(8, ge=1)
    batch_size: int = Field(256, ge=1, description="per rank")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0)
    weight_decay: float = Field(0.0, ge=0.0)
    seed: int = 42
    shuffle_buffer_row_groups: int = Field(4, ge=1)
    timeout_s: int = Field(300, ge=5, description="collective / rendezvous timeout")
    checkpoint_keep: int = Field(2, ge=1)
    checkpoint_every_steps: int = Field(0, ge=0, description="also checkpoint every N optimizer steps (0: epoch ends only)")
    max_attempts: int = Field(3, ge=1, description="barrier-stage launches before giving up; each resumes from the last checkpoint")
    straggler_factor: float = Field(1.5, gt=1.0, description="a rank whose median step time exceeds factor x the ranks' median is reported")
    device: Literal["cpu", "cuda", "auto"] = "auto"
    threads_per_rank: int = Field(0, ge=0, description="torch intra-op threads; 0 = cores / ranks")
    log_every_steps: int = Field(50, ge=1)
    horovod: HorovodConfig = HorovodConfig()
    parallel: ParallelConfig = ParallelConfig()
    async_ps: AsyncConfig = AsyncConfig()

    @model_validator(mode="after")
    def _strategy_fits(self) -> TrainConfig:
        if self.strategy == "async" and self.num_ranks <= self.async_ps.servers:
            raise ValueError(f"train.strategy=async needs workers: train.num_ranks ({self.num_ranks}) must exceed "
                             f"train.async_ps.servers ({self.async_ps.servers})")
        if self.backend == "horovod" and self.strategy != "ddp":
            raise ValueError(f"train.strategy={self.strategy} runs on torch.distributed; Horovod does data "
                             "parallelism only: set train.backend=torch or train.strategy=ddp")
        if self.strategy == "pipeline" and self.batch_size % self.parallel.microbatches:
            raise ValueError(f"train.batch_size ({self.batch_size}) must be divisible by "
                             f"train.parallel.microbatches ({self.parallel.microbatches})")
        if self.strategy == "hybrid":
            tp = self.parallel.tensor_parallel
            if tp < 2 or self.num_ranks % tp or self.num_ranks // tp < 2:
                raise ValueError(f"train.strategy=hybrid needs train.num_ranks ({self.num_ranks}) = data parallel (>=2) "
                                 f"x train.parallel.tensor_parallel ({tp}, >=2), e.g. 4 ranks as 2x2")
        return self

    @model_validator(mode="after")
    def _horovod_options_are_possible(self) -> TrainConfig:
        h = self.horovod
        if self.backend != "horovod":
            if h != HorovodConfig():
                raise ValueError("train.horovod.* is set but train.backend is not 'horovod'; set train.backend=horovod")
            return self
        on_gpu = self.device == "cuda"
        if h.compression == "bf16" and not on_gpu:
            raise ValueError("train.horovod.compression=bf16: Horovod's Gloo CPU operations have no bf16; "
                             "use 'fp16' or 'none' (or train.device=cuda with an NCCL build)")
        if h.reduce_op == "adasum":
            raise ValueError("train.horovod.reduce_op=adasum needs Horovod built with MPI; this build uses Gloo "
                             "only. Use 'average'")
        if h.sync_batch_norm and not on_gpu:
            raise ValueError("train.horovod.sync_batch_norm: Horovod's SyncBatchNorm runs on GPUs only; "
                             "set it to false or train.device=cuda")
        return self


class GateConfig(_Strict):
    metric: Literal["accuracy", "roc_auc", "f1"] = "accuracy"
    min_value: float = Field(0.84, ge=0.0, le=1.0)
    must_beat_champion: bool = True


class TrackingConfig(_Strict):
    tracking_uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db")
    experiment: str = "sparkml_dist"
    registered_model: str = "sparkml_dist_model"
    gate: GateConfig = GateConfig()


class SparkConfig(_Strict):
    master: str = Field("local[*]", description="ignored when spark-submit sets --master")
    app_name: str = "sparkml_dist"
    conf: dict[str, str] = Field(default_factory=dict)


class FinetuneConfig(_Strict):
    """`finetune` job: continue training a registered model on new data (jobs/finetune.py)."""

    base_model: str | None = Field(None, description="models:/<name>@<alias>, models:/<name>/<version> or runs:/<id>/model; "
                                                     "default models:/<tracking.registered_model>@champion")
    where: str | None = Field(None, description="Spark SQL predicate over the raw columns choosing the rows to fine-tune "
                                                "on (and the subset the result is measured on), e.g. \"age < 30\"")
    epochs: int = Field(3, ge=1)
    learning_rate: float = Field(2e-4, gt=0.0, le=1.0, description="usually well below train.learning_rate")
    freeze: list[str] = Field(default_factory=list, description="parameter-name prefixes kept fixed, e.g. [net.0]")
    lora_rank: int = Field(0, ge=0, description=">0: low-rank adapters on the Linear layers, base weights frozen")
    lora_alpha: float = Field(8.0, gt=0.0)
    max_original_drop: float = Field(0.02, ge=0.0, le=1.0,
                                     description="the gate metric on the original test set may fall by at most this")
    alias: str = Field("finetuned", min_length=1, description="alias the new version gets when it passes")


class CommunityConfig(_Strict):
    """`contribute` job: validate a submitted parameter delta before merging it (jobs/contribute.py)."""

    base_model: str | None = Field(None, description="the model deltas apply to; default models:/<tracking.registered_model>@champion")
    max_delta_norm: float = Field(10.0, gt=0.0, description="L2 norm bound of the whole update")
    max_regression: float = Field(0.005, ge=0.0, le=1.0, description="the gate metric on held-out rows may fall by at most this")
    validation_path: str | None = Field(None, description="held-out rows (raw CSV); default data.test_path")
    alias: str | None = Field("community", description="alias an accepted contribution's version gets (null: none)")


class FederatedConfig(_Strict):
    """`federated` job: clients are the groups of `client_column`; rows never leave their partition."""

    client_column: str | None = Field(None, description="raw column whose values are the clients, e.g. occupation")
    rounds: int = Field(10, ge=1)
    client_fraction: float = Field(1.0, gt=0.0, le=1.0, description="clients sampled per round")
    min_clients: int = Field(2, ge=1, description="a round with fewer sampled or on-time clients is skipped (counted)")
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0)
    algorithm: Literal["fedavg", "fedprox"] = "fedavg"
    proximal_mu: float = Field(0.01, ge=0.0, description="fedprox: weight of mu/2 ||w - w_global||^2")
    clip_norm: float | None = Field(None, gt=0.0, description="per-client L2 bound on the update")
    noise_multiplier: float = Field(0.0, ge=0.0, description="Gaussian noise std on the summed update = this x clip_norm")
    secure_aggregation: bool = Field(False, description="pairwise X25519 masks: the driver sees only the sum")
    round_timeout_s: float = Field(300.0, gt=0.0, description="a client still training this long after it started is dropped for the round (counted)")
    seed: int = 7

    @model_validator(mode="after")
    def _noise_needs_a_bound(self) -> FederatedConfig:
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError("federated.noise_multiplier > 0 needs federated.clip_norm (the noise is scaled to the bound)")
        return self


class OutputConfig(_Strict):
    root: str = "output"


class JobConfig(_Strict):
    data: DataConfig
    features: FeatureConfig = FeatureConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    tracking: TrackingConfig = TrackingConfig()
    spark: SparkConfig = SparkConfig()
    output: OutputConfig = OutputConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    community: CommunityConfig = CommunityConfig()
    federated: FederatedConfig = FederatedConfig()

    @model_validator(mode="after")
    def _model_fits_strategy(self) -> JobConfig:
        strategy, t = self.train.strategy, self.model.transformer
        if strategy in ("pipeline", "tensor", "hybrid") and self.model.kind != "transformer":
            raise ValueError(f"train.strategy={strategy} cuts a transformer's layers; set model.kind=transformer "
                             "(or use train.strategy=ddp or fsdp for the mlp)")
        tp = {"tensor": self.train.num_ranks, "hybrid": self.train.parallel.tensor_parallel}.get(strategy, 1)
        if t.heads % tp:
            raise ValueError(f"model.transformer.heads ({t.heads}) must be divisible by the tensor-parallel size ({tp})")
        if t.mlp_hidden % tp:
            raise ValueError(f"model.transformer.mlp_hidden ({t.mlp_hidden}) must be divisible by the tensor-parallel size ({tp})")
        client = self.federated.client_column
        if strategy == "federated" and client is None:
            raise ValueError("train.strategy=federated needs federated.client_column: the column whose values are "
                             "the clients, e.g. occupation")
        if client is not None and client not in [c.name for c in self.data.columns]:
            raise ValueError(f"federated.client_column {client!r} is not one of data.columns")
        if strategy == "pipeline" and t.layers < self.train.num_ranks:
            raise ValueError(f"train.strategy=pipeline puts at least one block per rank: model.transformer.layers "
                             f"({t.layers}) must be >= train.num_ranks ({self.train.num_ranks})")
        return self

    def flat_params(self) -> dict[str, str]:
        """The resolved config as flat `a.b.c -> value` pairs, for MLflow params."""
        flat: dict[str, str] = {}

        def walk(prefix: str, value) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                flat[prefix] = ",".join(str(v.get("name", v)) for v in value)
            else:
                flat[prefix] = str(value)

        walk("", self.model_dump(mode="json"))
        return flat
