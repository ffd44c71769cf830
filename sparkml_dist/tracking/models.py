"""Log, register, alias and load models through an explicit MlflowClient."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import shutil
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path

from sparkml_dist import storage
from sparkml_dist.data.raw_features import RAW_FEATURES_FILE
from sparkml_dist.errors import SparkMLDistError, StorageError
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.models.custom import code_root, ship_code
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.spark.kind import runs_in_this_process
from sparkml_dist.tasks.base import UNRECORDED_TARGET, Target
from sparkml_dist.tracking.client import RunHandle
from sparkml_dist.train.records import TrainedModel

MODEL_DIR = "model"
log = logging.getLogger(__name__)


PACKAGE = Path(__file__).resolve().parents[1]  # this package's source, shipped inside every model


@functools.lru_cache(maxsize=1)
def _package_source() -> str:
    """This package's source directory; when it was imported from a zip (spark-submit --py-files),
    a copy extracted from that zip (once per process)."""
    if PACKAGE.is_dir():
        return str(PACKAGE)
    archive = next(p for p in PACKAGE.parents if p.is_file())
    inside = PACKAGE.relative_to(archive).as_posix()
    target = Path(tempfile.mkdtemp(prefix="sparkml_dist_code_"))
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(target, [m for m in zf.namelist() if m.startswith(f"{inside}/")])
    return str(target / inside)


@functools.lru_cache(maxsize=1)
def _downloads() -> str:
    """The folder this process downloads models into, removed when it exits: a scheduled job or a
    notebook loads a model in every evaluate and score, and each download is a megabyte or more
    that nothing else would remove. (A caller that keeps a model longer passes its own `dst`.)"""
    root = tempfile.mkdtemp(prefix="sparkml_dist_models_")
    atexit.register(shutil.rmtree, root, True)
    return root


def _pip_requirements() -> list[str]:
    """Pinned, and all on the public index: MLflow's environment restore installs exactly these
    (the package itself travels as code, `_code_paths`). Explicit: skips MLflow's slow inference."""
    from importlib.metadata import version

    return [
        f"mlflow=={version('mlflow')}",
        f"torch=={version('torch').split('+')[0]}",
        f"numpy=={version('numpy')}",
        f"pandas=={version('pandas')}",
        f"pyarrow=={version('pyarrow')}",
        f"pydantic=={version('pydantic')}",
        f"pyyaml=={version('pyyaml')}",
    ]


def _code_paths(spec: ModelSpec) -> list[str]:
    """The package's code goes with every model, so it loads where sparkml_dist is not installed
    (MLflow puts code paths on sys.path); a custom model's code too."""
    paths = [_package_source()]
    if spec.custom is not None:
        paths.append(str(code_root(spec.custom.factory)))
    return paths


def _raw_features(feature_pipeline_dir: str | None) -> list[dict] | None:
    """The fitted pipeline as plain data for Spark-free scoring of raw rows (`data.raw_features`):
    the file preprocess saved beside the pipeline's stages. A pipeline saved before that file
    existed is read with Spark when a session is active (on this machine's own disk); None
    without a pipeline, or for one that does not compile."""
    if not feature_pipeline_dir:
        return None
    # pyspark: only on the path that needs it
    from sparkml_dist.data.features import raw_features, saved_raw_features

    saved = saved_raw_features(feature_pipeline_dir)
    if saved is not None:
        return saved.to_json()
    from pyspark.ml import PipelineModel
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is None:
        return None

    try:
        raw = raw_features(PipelineModel.load(storage.spark_path(feature_pipeline_dir)))
    except Exception as exc:
        log.warning(
            "the model takes assembled features, not raw rows: its pipeline could not be read (%s)", exc
        )
        return None
    return None if raw is None else raw.to_json()


def _signature(target: Target, raw: list[dict] | None, training_schema: Mapping[str, str] | None):
    """Raw columns in, the task's columns out; or the `features` array in, for a model logged
    without a pipeline. A text column is `string` (pandas' object column with None passes); every
    other column is `Any`: MLflow refuses int64 for a double column and float64 with NaN for a long
    one, and rows as `pd.read_csv` returns them hold either. The model's own reading
    (`RawFeatures.dense`) then names the column and the value it cannot use."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, Array, ColSpec, Schema, TensorSpec

    columns = target.kind.output_columns(target)
    inputs: list[ColSpec | TensorSpec]
    if raw is None:
        columns = columns[:1] if target.kind.thresholded else columns
        inputs = [ColSpec(Array("float"), "features")]
    else:
        schema = training_schema or {}
        text = {
            slot["source"]
            for slot in raw
            if slot["kind"] != "numeric" and schema.get(slot["source"], "string/").startswith("string")
        }
        inputs = [
            ColSpec("string" if source in text else AnyType(), source)
            for source in dict.fromkeys(slot["source"] for slot in raw)
        ]
    outputs: list[ColSpec | TensorSpec] = [
        ColSpec(
            Array("float") if kind.startswith("array") else "integer" if kind == "integer" else "double", name
        )
        for name, kind in columns
    ]
    if raw is not None and target.classes:
        outputs.append(ColSpec("string", "predicted_label"))
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def log_model(handle: RunHandle, model: TrainedModel) -> str:
    """Save the pyfunc model locally, upload it under the run; return `runs:/<id>/model`."""
    with tempfile.TemporaryDirectory() as tmp:
        if model.feature_pipeline is None:
            local = save_pyfunc_model(
                tmp, model.weights, model.spec, None, model.training_schema, model.target
            )
        else:  # MLflow uploads local directories: a remote pipeline comes down first
            with storage.local_copy(model.feature_pipeline) as pipeline:
                local = save_pyfunc_model(
                    tmp, model.weights, model.spec, str(pipeline), model.training_schema, model.target
                )
        handle.client().log_artifacts(handle.run_id, local, MODEL_DIR)
    return f"runs:/{handle.run_id}/{MODEL_DIR}"


def save_pyfunc_model(
    directory: str,
    weights: bytes,
    spec: ModelSpec,
    feature_pipeline_dir: str | None,
    training_schema: Mapping[str, str] | None = None,
    target: Target | None = None,
) -> str:
    """Write the MLflow pyfunc model (spec, weights, target, feature pipeline, signature) under `directory`."""
    import mlflow.pyfunc

    with warnings.catch_warnings():  # MLflow advises type hints when the class is defined
        warnings.simplefilter("ignore", UserWarning)
        # MLflow, pandas: only on the path that needs it
        from sparkml_dist.tracking.pyfunc_model import TabularTorchModel

    files = Path(directory) / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / "weights.pt").write_bytes(weights)
    (files / "spec.json").write_text(json.dumps(spec.to_json()))
    target = target or UNRECORDED_TARGET
    (files / "target.json").write_text(json.dumps(target.to_json()))
    artifacts = {
        "weights": str(files / "weights.pt"),
        "spec": str(files / "spec.json"),
        "target": str(files / "target.json"),
    }
    if training_schema:
        (files / "training_schema.json").write_text(json.dumps(dict(training_schema)))
        artifacts["training_schema"] = str(files / "training_schema.json")
    if feature_pipeline_dir:
        artifacts["feature_pipeline"] = feature_pipeline_dir
    raw = _raw_features(feature_pipeline_dir)
    if raw is not None:
        (files / RAW_FEATURES_FILE).write_text(json.dumps(raw))
        artifacts["raw_features"] = str(files / RAW_FEATURES_FILE)
    local = Path(directory) / MODEL_DIR
    with warnings.catch_warnings():  # the explicit signature makes MLflow's type-hint advice moot
        warnings.simplefilter("ignore", UserWarning)
        mlflow.pyfunc.save_model(
            str(local),
            python_model=TabularTorchModel(),
            artifacts=artifacts,
            signature=_signature(target, raw, training_schema),
            pip_requirements=_pip_requirements(),
            code_paths=_code_paths(spec),
        )
    return str(local)


def register(handle: RunHandle, model_uri: str, name: str, tags: dict[str, str]) -> str:
    """Create a new version of `name` from `model_uri`; return the version number. The version's
    source and run are those of the run that logged the model, which need not be `handle`'s: a
    tune job registers its best trial's model (a nested run) from its own run."""
    from mlflow.exceptions import MlflowException

    client = handle.client()
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    run_id, path = _logged_by(model_uri, handle.run_id)
    source = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/" + path
    version = client.create_model_version(name, source=source, run_id=run_id, tags=tags)
    return str(version.version)


def _logged_by(model_uri: str, default_run_id: str) -> tuple[str, str]:
    """(run id, artifact path) of a `runs:/<run id>/<path>` URI; another URI's path under the default run."""
    if model_uri.startswith("runs:/"):
        run_id, _, path = model_uri[len("runs:/") :].partition("/")
        return run_id, path
    return default_run_id, model_uri.split("/", 3)[-1]


def versions_tagged(tracking_uri: str, name: str, tags: dict[str, str]) -> list:
    """The versions of `name` that carry every one of `tags` (none when there is no such model)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    found = client.search_model_versions(f"name = '{name}'")  # tag filters: in Python, every store has them
    return [v for v in found if all(v.tags.get(k) == value for k, value in tags.items())]


def champion_version(tracking_uri: str, name: str, alias: str = "champion"):
    """The version holding `alias`, or None when there is none (or no such model yet)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_by_alias(
            name, alias
        )
    except MlflowException:
        return None


_DOWNLOADED: dict[tuple[str, str], Path] = {}  # (tracking URI, model files' location) -> this process's copy
_DOWNLOADED_LOCK = threading.Lock()


def _downloaded(source: str, tracking_uri: str, dst: str | None) -> Path:
    """The model's files that this package reads: `artifacts/` and a custom model's code, not the
    copy of the package under `code/` (hundreds of files; the installed package runs here). Once
    per process for a location (a version's or a run's files do not change once logged), unless
    the caller asks for its own `dst`."""
    import mlflow.artifacts

    key = (tracking_uri, source)
    with _DOWNLOADED_LOCK:
        if dst is None and key in _DOWNLOADED and (_DOWNLOADED[key] / "artifacts").is_dir():
            return _DOWNLOADED[key]
        local = Path(dst or tempfile.mkdtemp(dir=_downloads()))
        root = source.rstrip("/")
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"{root}/artifacts", tracking_uri=tracking_uri, dst_path=str(local)
        )
        for entry in mlflow.artifacts.list_artifacts(artifact_uri=f"{root}/code", tracking_uri=tracking_uri):
            name = entry.path.rstrip("/").rsplit("/", 1)[-1]
            if name != PACKAGE.name:
                (local / "code").mkdir(exist_ok=True)
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{root}/code/{name}",
                    tracking_uri=tracking_uri,
                    dst_path=str(local / "code"),
                )
        if dst is None:
            _DOWNLOADED[key] = local
        return local


def resolve_registry_uri(model_uri: str, tracking_uri: str) -> str:
    """`models:/name@alias` or `models:/name/version` -> the version's artifact location, looked
    up in *this* tracking server's registry (MLflow would otherwise use the process-global
    registry URI, i.e. whatever ./mlflow.db the working directory holds)."""
    version = model_version(model_uri, tracking_uri)
    if version is None:
        return model_uri
    name = model_uri[len("models:/") :].rstrip("/").split("@", 1)[0].rsplit("/", 1)[0]
    return _registry_client(tracking_uri).get_model_version_download_uri(name, version)


def model_version(model_uri: str, tracking_uri: str) -> str | None:
    """The registry version a `models:/` URI points at now (None for runs:/ and paths)."""
    if not model_uri.startswith("models:/"):
        return None
    ref = model_uri[len("models:/") :].rstrip("/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        version = champion_version(tracking_uri, name, alias)
        if version is None:
            raise SparkMLDistError(
                f"{model_uri}: no version of '{name}' holds the alias '{alias}' in {tracking_uri} (no model has "
                f"passed the gate yet, or none was registered); pass --model-uri models:/{name}/<version>"
            )
        return str(version.version)
    return ref.rsplit("/", 1)[1]


def _registry_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def load_bundle(
    model_uri: str, tracking_uri: str, dst: str | None = None, spark=None, shared_dir: str | None = None
) -> ModelBundle:
    """Download a logged model (runs:/, models:/name@alias, models:/name/version) as a bundle.
    With `spark`, a custom model's code is shipped to the executors (and the driver's path), and
    on a cluster the feature pipeline (which Spark's executors read) is published under
    `shared_dir`, since the download lands on the driver's own disk."""

    from mlflow.exceptions import MlflowException

    source = resolve_registry_uri(model_uri, tracking_uri)
    try:
        local = _downloaded(source, tracking_uri, dst)
    except MlflowException as exc:
        found = " ".join(
            line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("#")
        )
        raise StorageError(
            f"{model_uri}: its model files at {source} cannot be downloaded ({found[:300]}); check "
            f"that the run's artifacts are still there and that this job reads the same tracking "
            f"store and artifact location as the job that logged them"
        ) from None
    artifacts = local / "artifacts"
    spec = ModelSpec.from_json(json.loads((artifacts / "spec.json").read_text()))
    pipeline = artifacts / "feature_pipeline"
    schema = artifacts / "training_schema.json"
    target = artifacts / "target.json"
    code = local / "code"
    # a custom model's code (this package's own copy stays out: the installed one runs here)
    code_paths = (
        tuple(str(p) for p in sorted(code.iterdir()) if p.name != PACKAGE.name) if code.is_dir() else ()
    )
    if spark is not None and code_paths:
        ship_code(spark, code_paths)
    pipeline_path = str(pipeline) if pipeline.exists() else None
    published = None
    if pipeline_path and spark is not None and shared_dir and not runs_in_this_process(spark):
        # pyspark: only on the path that needs it
        from sparkml_dist.storage.hadoop import publish_for_executors

        key = hashlib.sha256(source.encode()).hexdigest()[:16]  # one copy per model version / run
        published = publish_for_executors(
            spark, pipeline_path, storage.join(shared_dir, key, "feature_pipeline")
        )
    return ModelBundle(
        spec=spec,
        weights=(artifacts / "weights.pt").read_bytes(),
        feature_pipeline_path=pipeline_path,
        executor_pipeline_path=published,
        uri=model_uri,
        training_schema=json.loads(schema.read_text()) if schema.exists() else None,
        target=Target.from_json(json.loads(target.read_text())) if target.exists() else UNRECORDED_TARGET,
        code_paths=code_paths,
    )
