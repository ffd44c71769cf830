"""The job config schema. Validated once, at the edge; unknown keys are errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, SerializeAsAny, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from sparkml_dist.config.overrides import apply_overrides
from sparkml_dist.config.section import Section, error_at
from sparkml_dist.config.train import TrainConfig, train_section
from sparkml_dist.config.tune import TuneConfig, space_problems
from sparkml_dist.data.formats import SOURCE_FORMATS, format_of, format_of_files_in, named_format
from sparkml_dist.models.kinds import MODEL_KINDS
from sparkml_dist.tasks.base import TASKS, resolve_task
from sparkml_dist.tasks.checks import task_problems

ColumnType = Literal["int", "double", "string", "boolean"]
ColumnRole = Literal["numeric", "categorical", "label", "id", "ignore", "weight"]


class ColumnSpec(Section):
    """One input column. For CSV every column is listed, in file order, with its type; for typed
    sources (parquet, orc, json, table) the types come from the source and an entry only
    overrides a column's role."""

    name: str = Field(
        min_length=1, description="column name (CSV columns are positional: list them in file order)"
    )
    type: ColumnType | None = Field(
        None,
        description="CSV: how the raw text is parsed (required); a value that does not "
        "parse is quarantined. Typed sources: a cast of the source column (a value it cannot "
        "read is quarantined)",
    )
    role: ColumnRole = Field(
        description="numeric and categorical columns are features; one column is the label; id "
        "columns pass through to predictions; ignore columns are read and dropped; "
        "weight: data.weight_column"
    )

    @property
    def given_type(self) -> ColumnType:
        """`type`, where the caller needs one: a CSV column's (required) or a typed source's cast."""
        if self.type is None:
            raise ValueError(
                f"data.columns: '{self.name}' has no type; give it one (int, double, string, boolean)"
            )
        return self.type


class LabelSpec(Section):
    """The label column and what kind of target it is."""

    column: str = Field(description="the label column")
    task: str | None = Field(
        None,
        description="binary, multiclass or regression; default: binary when positive and "
        "negative are given or a typed source's label is boolean (true "
        "positive), else regression for a double label and multiclass "
        "for any other",
    )
    positive: str | None = Field(None, description="binary: raw value of the positive class")
    negative: str | None = Field(None, description="binary: raw value of the negative class")
    classes: list[str] | None = Field(
        None,
        description="multiclass: the classes, in output order (default: every "
        "value in the training rows, sorted); other values are rejected",
    )
    strip_suffix: str = Field("", description="classification: suffix removed before matching, e.g. '.'")

    @model_validator(mode="after")
    def _both_classes_or_neither(self) -> LabelSpec:
        # one alone would resolve to multiclass (resolve_task), not binary: refuse it whatever the task
        given = [k for k in ("positive", "negative") if getattr(self, k) is not None]
        if len(given) == 1:
            (other,) = {"positive", "negative"} - set(given)
            raise ValueError(
                f"data.label.{given[0]} is given without data.label.{other}: a binary label names the raw "
                f"values of both its classes; give data.label.{other} too, or neither for a multiclass "
                "label (data.label.classes lists its classes)"
            )
        return self

    @property
    def resolved_task(self) -> str:
        """`task` once decided: at load, or for a typed source once its label's type is read
        (data/sources.py::with_task)."""
        if self.task is None:
            raise ValueError(f"data.label.task of '{self.column}' is not decided yet: read the source first")
        return self.task


class DataConfig(Section):
    """The input: where the rows are, their columns and how to read them, the label, the splits."""

    train_path: str = Field(
        description="training rows: a file, a directory or a glob, or a table name with format "
        "table; pkg://<package>/<file> reads a file shipped in an installed package"
    )
    test_path: str = Field(
        description="held-out rows for the test metrics and the gate; read in the format its "
        "extension or files name, else train_path's"
    )
    score_path: str | None = Field(
        None, description="raw rows to score (format: as test_path); defaults to test_path"
    )
    format: str | None = Field(
        None,
        description="a name in the source-format registry; built in: csv, parquet, orc, json or table "
        "(spark.table(<path>)); "
        "default from the path's extension, or for a local "
        "directory from its files' extensions, else csv",
    )
    header: bool = Field(
        False,
        description="csv: the first line of each file names the columns; data.columns may then "
        "be left out (types inferred from the first rows, roles from the types) "
        "or list only the columns to override (docs/tasks.md)",
    )
    delimiter: str = Field(",", min_length=1, max_length=1, description="csv: field separator")
    null_values: list[str] = Field(
        ["?"], description="csv: raw values read as missing (imputed for numeric features)"
    )
    columns: list[ColumnSpec] = Field(
        default_factory=list,
        description="csv: every column of the input, in order "
        "(with a header: only the ones to override); "
        "typed sources: only the roles to override",
    )
    label: LabelSpec = Field(description="the label column and its task")
    weight_column: str | None = Field(
        None,
        description="a numeric column of per-row weights for the loss and the "
        "metrics (>= 0; a row with a missing or negative weight is "
        "rejected)",
    )
    validation_fraction: float = Field(
        0.1,
        gt=0.0,
        lt=0.5,
        description="share of the training rows held out for validation, by a hash of the row id",
    )
    split_seed: int = Field(7, description="seed of the validation split (same input, same split)")
    max_reject_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="preprocess stops, naming the most common "
        "reasons, when more of an input's rows than this are rejected (a wrong type "
        "or delimiter in data.columns, not dirty rows); 1.0 never stops",
    )
    files_per_rank: int = Field(2, ge=1, le=64, description="Parquet files per rank in the training split")
    row_group_rows: int = Field(
        2048,
        ge=64,
        description="about this many rows per Parquet row group (the unit a rank reads and shuffles)",
    )

    # the feature columns of the trained model that rows are read for (with_model_features): a
    # source column outside them that data.columns does not name is not a feature. None: rows read
    # to train on, whose columns make the features
    _model_features: frozenset[str] | None = PrivateAttr(None)

    @property
    def model_features(self) -> frozenset[str] | None:
        return self._model_features

    def with_model_features(self, features) -> DataConfig:
        copy = self.model_copy()
        copy._model_features = frozenset(features)
        return copy

    @property
    def source_format(self) -> str:
        return format_of(self.train_path, self.format)

    def format_of_input(self, location: str) -> str:
        """The format to read `location` in: for a path other than train_path, the one its own
        extension or files name (a model trained on Parquet scores JSON lines as readily), else
        data.format or the training rows' format. With format table, a name without a '/' is a
        table's (`db.new_rows`, never a file), and a path is read as its own format names."""
        by_name = self.format is not None and SOURCE_FORMATS.get(self.format).catalog
        if location == self.train_path or (by_name and "/" not in location):
            return self.source_format
        return named_format(location) or format_of_files_in(location) or self.source_format

    @property
    def typed(self) -> bool:
        return SOURCE_FORMATS.get(self.source_format).typed

    @property
    def declared_label_type(self) -> str | None:
        return next((c.type for c in self.columns if c.name == self.label.column), None)

    @model_validator(mode="before")
    @classmethod
    def _a_weight_role_names_the_weight_column(cls, raw):
        """One column with role weight is data.weight_column; saying it twice is not needed."""
        if isinstance(raw, dict) and raw.get("weight_column") is None:
            weights = [
                c.get("name")
                for c in raw.get("columns") or []
                if isinstance(c, dict) and c.get("role") == "weight"
            ]
            if len(weights) == 1:
                return {**raw, "weight_column": weights[0]}
        return raw

    @field_validator("format")
    @classmethod
    def _registered_format(cls, fmt: str | None) -> str | None:
        return _registered_format(fmt)

    @model_validator(mode="after")
    def _roles_are_consistent(self) -> DataConfig:
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"column names must be unique; repeated: {dupes}")
        if not self.typed and not self.columns:
            raise ValueError(self._csv_needs_columns())
        labels = [c.name for c in self.columns if c.role == "label"]
        if labels not in ([self.label.column], [] if self.typed else [self.label.column]):
            raise ValueError(
                f"the label column is data.label.column ('{self.label.column}'); found role 'label' on "
                f"{labels}" + ("" if self.typed else ": give exactly that column role 'label'")
            )
        weights = [c.name for c in self.columns if c.role == "weight"]
        if weights not in ([], [self.weight_column]):
            raise ValueError(
                f"role 'weight' on {weights} but data.weight_column is {self.weight_column!r}; set "
                f"data.weight_column to the weight column"
            )
        for c in self.columns:
            if c.role == "numeric" and c.type in ("string", "boolean"):
                raise ValueError(
                    f"column '{c.name}' has role 'numeric' but type '{c.type}'; use int or double"
                )
        if self.typed:
            return self
        untyped = [c.name for c in self.columns if c.type is None]
        if len(self.columns) < 2 or untyped:
            raise ValueError(self._csv_needs_columns(untyped))
        if not any(c.role in ("numeric", "categorical") for c in self.columns):
            raise ValueError("no feature columns: give at least one column role 'numeric' or 'categorical'")
        if self.weight_column is not None and self.weight_column not in weights:
            raise ValueError(
                f"data.weight_column {self.weight_column!r}: list it in data.columns with role 'weight'"
            )
        return self

    def _csv_needs_columns(self, untyped: list[str] | None = None) -> str:
        why = (
            f"; data.format is csv because train_path '{self.train_path}' names no other format (no .parquet, "
            f".orc or .json extension, nor a local directory of such files): set data.format for a typed source"
            if self.format is None
            else ""
        )
        return (
            "data.columns: a csv source lists every column, in file order, each with a type (int, double, "
            f"string, boolean){'; no type on ' + str(untyped) if untyped else ''}{why}"
        )

    def names_with_role(self, role: ColumnRole) -> list[str]:
        return [c.name for c in self.columns if c.role == role]


class FeatureConfig(Section):
    """Spark ML feature engineering, fitted on the training rows and saved with the model."""

    impute_strategy: Literal["median", "mean"] = Field("median", description="fills missing numeric values")
    scale_numeric: bool = Field(True, description="standardise numeric features (mean 0, variance 1)")
    one_hot: bool = Field(
        True, description="one-hot encode categorical features (else their index is one feature)"
    )
    max_categories: int | None = Field(
        None,
        ge=1,
        description="keep each categorical column's N most frequent training values (ties "
        "alphabetical); its rarer values share the slot of values never seen in training. "
        "Unset: every value has a slot",
    )


class TransformerConfig(Section):
    """The tabular transformer (model.kind=transformer): one token per source column."""

    d_model: int = Field(32, ge=4, description="token width")
    heads: int = Field(4, ge=1, description="attention heads (divides d_model)")
    layers: int = Field(2, ge=1, description="transformer blocks")
    mlp_hidden: int = Field(64, ge=1, description="hidden width of each block's MLP")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerConfig:
        if self.d_model % self.heads:
            raise ValueError(
                f"model.transformer.d_model ({self.d_model}) must be divisible by "
                f"model.transformer.heads ({self.heads})"
            )
        return self


class ModelConfig(Section):
    """The network (rebuilt anywhere from its spec; weights are state_dicts)."""

    kind: str = Field(
        "mlp",
        description="the network, a name in the model-kind registry; built in: mlp (dense layers over "
        "the feature vector), transformer (one token per source column), custom (your own nn.Module "
        "from model.factory)",
    )
    hidden: list[int] = Field(
        default_factory=lambda: [128, 64], min_length=1, description="mlp hidden widths"
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout probability")
    transformer: TransformerConfig = Field(TransformerConfig(), description="model.kind=transformer")
    factory: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="model.kind=custom: 'package.module:function', called with (InputSpec, "
        "TaskSpec, model.options) and returning an nn.Module (docs/bring-your-own.md)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="model.kind=custom: the factory's third argument"
    )

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, kind: str) -> str:
        if kind not in MODEL_KINDS:
            raise PydanticCustomError(
                "unknown_model_kind",
                "unknown model kind '{kind}'; known: {known} (a new one is registered with "
                "sparkml_dist.models.kinds.MODEL_KINDS, docs/architecture.md)",
                {"kind": kind, "known": ", ".join(MODEL_KINDS.names())},
            )
        return kind

    @model_validator(mode="after")
    def _the_kinds_own_keys(self) -> ModelConfig:
        """The kind's own check, and model.factory/options only for a kind built from user code."""
        kind = MODEL_KINDS.get(self.kind)
        if kind.check is not None:
            kind.check(self)
        if not kind.user_code and (self.factory or self.options):
            users = [name for name, k in MODEL_KINDS if k.user_code]
            raise ValueError(
                f"model.factory and model.options are for model.kind={' or '.join(users)} "
                f"(model.kind is {self.kind})"
            )
        return self


class GateConfig(Section):
    """When a newly registered version may take the champion alias. The metric is any the task
    reports (binary: accuracy, roc_auc, f1, precision, recall, log_loss; multiclass: accuracy,
    macro_f1, weighted_f1, log_loss; regression: rmse, mae, r2); lower is better for log_loss,
    rmse and mae, and the bound and the champion comparison follow that."""

    metric: str | None = Field(
        None,
        description="test metric the gate compares; default by task: binary roc_auc, "
        "multiclass accuracy, regression r2",
    )
    min_value: float | None = Field(
        None,
        description="for a higher-is-better metric: the least a new champion may "
        "score (default: what a constant prediction scores)",
    )
    max_value: float | None = Field(
        None, description="for a lower-is-better metric: the most a new champion may score"
    )
    must_beat_champion: bool = Field(
        True, description="and only if it beats the champion re-scored on the same rows"
    )


class EvaluateConfig(Section):
    """How predictions are decided and judged."""

    threshold: float | Literal["f1"] = Field(
        0.5,
        description="binary: the probability at or above which a row is "
        "predicted positive; f1: the one with the best F1 on the "
        "validation split (stored in the model, used by scoring)",
    )

    @field_validator("threshold")
    @classmethod
    def _probability(cls, value):
        if isinstance(value, float) and not 0.0 < value < 1.0:
            raise ValueError("a probability threshold is strictly between 0 and 1 (or f1)")
        return value


class TrackingConfig(Section):
    """MLflow: where runs, models and registry versions go."""

    tracking_uri: str | None = Field(
        None,
        description="default: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db; "
        "a sqlite store's new experiments keep their artifacts beside "
        "it, in <its folder>/mlruns/<experiment> (a name with characters unsafe "
        "in a folder name: its safe part and a hash of the name)",
    )
    experiment: str = Field("sparkml_dist", description="MLflow experiment of the runs")
    registered_model: str = Field(
        "sparkml_dist_model", description="registry name the versions are created under"
    )
    gate: GateConfig = Field(GateConfig(), description="promotion to the champion alias")


class SparkConfig(Section):
    """The Spark session the CLI and notebooks build (a cluster's spark-submit settings win)."""

    master: str = Field("local[*]", description="ignored when spark-submit sets --master")
    remote: str | None = Field(
        None,
        description="a Spark Connect session instead of a classic one: sc://host:port, or local[N] "
        "for a local Connect server; the SPARK_REMOTE environment variable wins",
    )
    app_name: str = Field("sparkml_dist", description="Spark application name")
    conf: dict[str, str] = Field(default_factory=dict, description="any Spark conf; spark-submit --conf wins")
    executor_wait_s: float = Field(
        120.0,
        gt=0,
        description="on a cluster without dynamic allocation: fail, naming the "
        "gap between the executors asked for and the workers' free "
        "cores and memory, when no executor registers within this",
    )


class FinetuneConfig(Section):
    """`finetune` job: continue training a registered model on new data (jobs/finetune.py)."""

    base_model: str | None = Field(
        None,
        description="models:/<name>@<alias>, models:/<name>/<version> or runs:/<id>/model; "
        "default models:/<tracking.registered_model>@champion",
    )
    where: str | None = Field(
        None,
        description="Spark SQL predicate over the raw columns choosing the rows to fine-tune "
        'on (and the subset the result is measured on), e.g. "age < 30"; '
        "the label by its column name too",
    )
    epochs: int = Field(3, ge=1, description="passes over the fine-tuning rows")
    learning_rate: float = Field(2e-4, gt=0.0, le=1.0, description="usually well below train.learning_rate")
    freeze: list[str] = Field(
        default_factory=list, description="parameter-name prefixes kept fixed, e.g. [net.0]"
    )
    lora_rank: int = Field(
        0, ge=0, description=">0: low-rank adapters on the Linear layers, base weights frozen"
    )
    lora_alpha: float = Field(8.0, gt=0.0, description="LoRA scale: the adapter adds alpha / rank x B A x")
    max_original_drop: float = Field(
        0.02,
        ge=0.0,
        description="the gate metric on the original test set may get worse (in its "
        "direction and units) by at most this",
    )
    alias: str = Field("finetuned", min_length=1, description="alias the new version gets when it passes")


class CommunityConfig(Section):
    """`contribute` job: validate a submitted parameter delta before merging it (jobs/contribute.py)."""

    base_model: str | None = Field(
        None, description="the model deltas apply to; default models:/<tracking.registered_model>@champion"
    )
    max_delta_norm: float = Field(10.0, gt=0.0, description="L2 norm bound of the whole update")
    max_regression: float = Field(
        0.005,
        ge=0.0,
        description="the gate metric on held-out rows may get worse (in its "
        "direction and units: accuracy points, rmse in the "
        "label's units) by at most this",
    )
    validation_path: str | None = Field(
        None,
        description="held-out rows (raw) a contribution is judged on; default "
        "the training file's validation split (not the test set)",
    )
    max_delta_mb: float | None = Field(
        None,
        gt=0.0,
        description="a delta file larger than this is refused unread; "
        "default twice the base model's weights plus 1 MiB",
    )
    alias: str | None = Field(
        "community", description="alias an accepted contribution's version gets (null: none)"
    )


class FederatedConfig(Section):
    """`federated` job: clients are the groups of `client_column`; rows never leave their partition."""

    client_column: str | None = Field(
        None, description="raw column whose values are the clients, e.g. occupation"
    )
    rounds: int = Field(10, ge=1, description="federated rounds")
    client_fraction: float = Field(1.0, gt=0.0, le=1.0, description="clients sampled per round")
    min_clients: int = Field(
        2, ge=1, description="a round with fewer sampled or on-time clients is skipped (counted)"
    )
    local_epochs: int = Field(1, ge=1, description="passes over its own rows each client makes per round")
    batch_size: int = Field(64, ge=1, description="client batch size")
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0, description="client AdamW learning rate")
    algorithm: Literal["fedavg", "fedprox"] = Field(
        "fedavg", description="fedprox adds a proximal term for skewed clients"
    )
    proximal_mu: float = Field(0.01, ge=0.0, description="fedprox: weight of mu/2 ||w - w_global||^2")
    clip_norm: float | None = Field(None, gt=0.0, description="per-client L2 bound on the update")
    noise_multiplier: float = Field(
        0.0, ge=0.0, description="Gaussian noise std on the summed update = this x clip_norm"
    )
    dp_delta: float = Field(
        1e-5,
        gt=0.0,
        lt=1.0,
        description="the delta of the (epsilon, delta) the run reports when noise_multiplier > 0",
    )
    secure_aggregation: bool = Field(
        False, description="pairwise X25519 masks in a finite ring: the driver sees only the sum"
    )
    round_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="a client still training this long after it started is dropped for the round (counted)",
    )
    seed: int = Field(7, description="client sampling")

    @model_validator(mode="after")
    def _noise_needs_a_bound(self) -> FederatedConfig:
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError(
                "federated.noise_multiplier > 0 needs federated.clip_norm (the noise is scaled to the bound)"
            )
        return self


class ObserveConfig(Section):
    """What a run costs and where its time goes (`sparkml_dist.observe`): per-rank system metrics
    under MLflow's `system/` names, the step-time breakdown, and energy (docs/observability.md)."""

    system_metrics_interval_s: float = Field(
        5.0,
        ge=0.0,
        description="each rank samples its CPU, memory, network "
        "(and GPU) this often into the run as "
        "system/rank<N>/... metrics; 0: off",
    )
    step_breakdown: bool = Field(
        True,
        description="time each step's data wait, forward+backward, communication and "
        "optimizer step per rank (per-epoch medians and a stacked plot)",
    )
    cpu_watts_per_core: float = Field(
        7.0,
        gt=0.0,
        le=100.0,
        description="energy estimate where neither NVML nor RAPL can be read: joules = "
        "process CPU-seconds x this (a server CPU's TDP / its cores)",
    )


class ScoreConfig(Section):
    """Where scoring runs its model: batch scoring, evaluation, the stream and the served model."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: the GPU Spark assigned the scoring task (spark.task.resource.gpu.amount), else "
        "GPU 0 where torch sees one, else the CPU; cuda: the same, an error without a GPU; cpu: "
        "always the CPU. On a GPU, rows travel compact and are made dense there, in full fp32",
    )


class StreamConfig(Section):
    """`sparkml-dist stream`: continuous scoring with Structured Streaming (docs/streaming.md)."""

    trigger: Literal["processing_time", "available_now"] = Field(
        "processing_time",
        description="processing_time: a micro-batch every stream.interval while the query runs; "
        "available_now: score what the input holds, in micro-batches, then stop "
        "(for scheduled runs)",
    )
    interval: str = Field(
        "5 seconds",
        pattern=r"^\d+(\.\d+)? *(milliseconds?|ms|seconds?|s|minutes?|min)$",
        description="processing_time: how often a micro-batch starts, e.g. '1 second'",
    )
    max_files_per_trigger: int | None = Field(
        None, ge=1, description="new files one micro-batch reads at most (default: all that arrived)"
    )
    model_uri: str = Field(
        "",
        description="the model to follow: default models:/<tracking.registered_model>@champion; "
        "an alias is resolved again before every micro-batch",
    )
    format: str | None = Field(
        None,
        description="the format of the files that arrive (a registered format read from files: built in "
        "csv, parquet, orc, json); default: the one the files already in the input "
        "directory name, else data.format or the training rows' format (an empty directory "
        "that JSON lines will arrive in needs format: json and source_schema)",
    )
    source_schema: str | None = Field(
        None,
        description="typed formats: the input's schema as Spark DDL, e.g. "
        "'age INT, city STRING'; default: the schema of the files "
        "already in the input directory",
    )
    source_options: dict[str, str] = Field(
        default_factory=dict,
        description="extra options of Spark's streaming source, e.g. {cleanSource: archive}",
    )

    @field_validator("format")
    @classmethod
    def _a_format_of_files(cls, fmt: str | None) -> str | None:
        registered = _registered_format(fmt)
        if registered is not None and SOURCE_FORMATS.get(registered).catalog:
            raise ValueError(
                f"stream.format {fmt} names a table, not files that arrive; stream from a directory"
            )
        return fmt


def _registered_format(fmt: str | None) -> str | None:
    if fmt is not None and fmt not in SOURCE_FORMATS:
        raise PydanticCustomError(
            "unknown_format",
            "unknown format '{fmt}'; known: {known} (a new one is registered in sparkml_dist/data/formats.py)",
            {"fmt": fmt, "known": ", ".join(SOURCE_FORMATS.names())},
        )
    return fmt


class OutputConfig(Section):
    """Outputs: preprocessed splits, checkpoints, predictions, plots and the stages' records."""

    root: str = Field(
        "output",
        description="where every stage writes: a path (relative to the working directory) "
        "or a URI (file://, dbfs:/, s3://, gs://, abfss://, hdfs://)",
    )
    run_date: str | None = Field(
        None,
        description="set by --run-date (a scheduled run): outputs go under "
        "<root>/run_date=<date>, and a re-run for the date on the same "
        "input and config reuses the date's registry version",
    )


class JobConfig(Section):
    data: DataConfig
    features: FeatureConfig = FeatureConfig()
    model: ModelConfig = ModelConfig()
    # SerializeAsAny: dump the method's own keys too, not only the shared ones
    train: SerializeAsAny[TrainConfig] = Field(
        default_factory=lambda: train_section({}),
        description="training: shared keys plus the chosen method's own",
    )
    evaluate: EvaluateConfig = EvaluateConfig()
    tracking: TrackingConfig = TrackingConfig()
    spark: SparkConfig = SparkConfig()
    output: OutputConfig = OutputConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    community: CommunityConfig = CommunityConfig()
    federated: FederatedConfig = FederatedConfig()
    tune: TuneConfig = TuneConfig()
    observe: ObserveConfig = ObserveConfig()
    score: ScoreConfig = ScoreConfig()
    stream: StreamConfig = StreamConfig()

    @field_validator("train", mode="wrap")
    @classmethod
    def _train_by_method(cls, value: Any, handler) -> TrainConfig:
        return train_section(value)

    @model_validator(mode="after")
    def _sections_agree(self) -> JobConfig:
        client = self.federated.client_column
        listed = [c.name for c in self.data.columns]
        if client is not None and not self.data.typed and client not in listed:
            raise error_at(
                ("federated", "client_column"),
                client,
                ValueError(f"federated.client_column {client!r} is not one of data.columns"),
            )
        if self.data.label.task is not None and self.data.label.task not in TASKS:
            raise error_at(
                ("data", "label", "task"),
                self.data.label.task,
                ValueError(f"unknown task {self.data.label.task!r}; known: {', '.join(TASKS.names())}"),
            )
        if self.task is not None:
            for loc, problem in task_problems(self, self.task):
                raise error_at(loc, self.task, ValueError(problem))
        try:
            self.train.check_job(self)
        except ValueError as exc:  # a check across sections, reported at the train section
            raise error_at(("train",), self.train.strategy, exc) from None
        if self.tune.space:
            raw = self.model_dump(mode="json", exclude_unset=True)
            for key, problem in space_problems(raw, self.tune.space, _validation_message):
                raise error_at(("tune", "space", key), self.tune.space[key].corners(), ValueError(problem))
        return self

    @property
    def task(self) -> str | None:
        """The task, where the config alone decides it (a typed source's label type may decide it
        only when read: see `data.ingest`)."""
        declared = self.data.declared_label_type
        if self.data.label.task is None and self.data.label.positive is None and declared is None:
            return None
        return resolve_task(self.data.label, declared)

    def with_overrides(self, *overrides: str) -> JobConfig:
        """A copy with `--set`-style overrides applied and everything validated again (a changed
        `train.strategy` picks its method's keys): `cfg.with_overrides("train.epochs=3")`."""
        # only what was set: another method's defaults would be unknown keys to the new one
        return JobConfig.model_validate(
            apply_overrides(self.model_dump(mode="json", exclude_unset=True), overrides)
        )

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


def _validation_message(raw: dict) -> str | None:
    """None when `raw` is a valid job config, else what is wrong with it (key: reason)."""
    try:
        JobConfig.model_validate(raw)
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<top level>'}: "
            f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
    return None
