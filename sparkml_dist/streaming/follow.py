"""The model a stream scores with, following a registry alias: resolved again before every
micro-batch, so a moved `@champion` scores the next batch. A version that cannot score this
stream (its feature columns differ, or it does not load) is refused once, with the reason
logged, and the version in use is kept."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from sparkml_dist.data.features import ScoringPipeline
from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.inference.scoring import check_schema, load_pipeline
from sparkml_dist.tracking.models import load_bundle, model_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowedModel:
    version: str  # the registry version ("" for a runs:/ URI)
    uri: str  # models:/<name>/<version>: what this version is, whatever the alias says later
    bundle: ModelBundle
    pipeline: ScoringPipeline


@dataclass
class ModelFollower:
    """`current()` before each micro-batch: the version `model_uri` names now, loaded once."""

    model_uri: str  # models:/<name>@<alias>, models:/<name>/<version> or runs:/...
    tracking_uri: str
    spark: SparkSession
    shared_dir: str | None = None  # on a cluster: where executors read feature pipelines
    downloads: str | None = (
        None  # the folder each loaded version is downloaded into (None: the system's temp)
    )
    # the stream's columns, column -> "type/role"; None until the source is read (`expect`), since
    # a typed source is read with the types of the first version's training rows
    schema: Mapping[str, str] | None = None
    refused: dict[str, str] = field(default_factory=dict)  # version -> why it was not used
    _model: FollowedModel | None = None

    def current(self) -> FollowedModel:
        """The model to score the next micro-batch with. The first one must load and fit (the
        stream does not start otherwise); later, a version that does not is refused."""
        try:
            version = model_version(self.model_uri, self.tracking_uri) or ""
        except SparkMLDistError as exc:  # the alias was removed mid-stream
            if self._model is None:
                raise
            self._refuse("?", str(exc))
            return self._model
        if self._model is not None and (version == self._model.version or version in self.refused):
            return self._model
        try:
            candidate = self._load(version)
        except Exception as exc:
            if self._model is None:
                raise
            self._refuse(version, str(exc).splitlines()[0])
            return self._model
        if self._model is not None:
            log.info(
                "stream: %s moved from version %s to %s: the next micro-batch scores with %s",
                self.model_uri,
                self._model.version,
                version,
                candidate.uri,
            )
        self._model = candidate
        return candidate

    def start_with(self, version: str) -> None:
        """Use `version` until `current()` finds a version that loads and fits: a follower built
        mid-stream (in a Spark Connect server's worker) keeps what the stream started with when
        the alias has since moved to a version it refuses."""
        self._model = self._load(version)

    def expect(self, schema: Mapping[str, str]) -> None:
        """The stream's columns: the version in use must fit them (the stream does not start
        otherwise), and every later version is checked against them."""
        self.schema = schema
        if self._model is not None:
            check_schema(schema, self._model.bundle)

    def _load(self, version: str) -> FollowedModel:
        uri = self._pinned(version)
        bundle = load_bundle(
            uri,
            self.tracking_uri,
            dst=tempfile.mkdtemp(prefix="sparkml_dist_stream_model_", dir=self.downloads),
            spark=self.spark,
            shared_dir=self.shared_dir,
        )
        if self.schema is not None:
            check_schema(self.schema, bundle)
        return FollowedModel(version, uri, bundle, load_pipeline(bundle))

    def _pinned(self, version: str) -> str:
        if not version or not self.model_uri.startswith("models:/"):
            return self.model_uri
        name = self.model_uri[len("models:/") :].rstrip("/").split("@", 1)[0].rsplit("/", 1)[0]
        return f"models:/{name}/{version}"

    def _refuse(self, version: str, reason: str) -> None:
        if self.refused.get(version) != reason:
            log.warning(
                "stream: %s now names version %s, which is refused, and version %s keeps scoring: %s",
                self.model_uri,
                version,
                self._model.version if self._model else "?",
                reason,
            )
        self.refused[version] = reason
