"""Your own network in the pipeline: `model.kind: custom`, `model.factory: "package.module:function"`.

The factory is called as `function(inputs, task, options)` with an `InputSpec`, a `TaskSpec` and the
`model.options` mapping, and returns an `nn.Module` that maps float32 [rows, inputs.dim] to [rows]
(task.output_dim == 1: a binary logit or a regression value) or [rows, task.output_dim] (one logit
per class). It is checked on the driver before any rank starts; its code travels with the job (to
the executors with addPyFile) and with the logged model (MLflow `code_paths`), so ranks, scoring,
evaluation and fine-tuning need not have it installed."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkml_dist.errors import UserCodeError
from sparkml_dist.spark.kind import is_connect


@dataclass(frozen=True)
class InputSpec:
    """What the network reads: `dim` float32 features per row, named (one-hot slots named by value)."""

    dim: int
    feature_names: tuple[str, ...]


@dataclass(frozen=True)
class TaskSpec:
    """What the network must output: `output_dim` values per row ([rows] when it is 1)."""

    name: str  # binary | multiclass | regression
    output_dim: int
    classes: tuple[str, ...] = ()  # classifiers: the class names in output order


def task_spec(target) -> TaskSpec:
    """The `TaskSpec` of a fitted `sparkml_dist.Target`."""
    return TaskSpec(target.task, target.kind.output_dim(target), tuple(target.classes))


@dataclass(frozen=True)
class CustomModel:
    """The JSON-able part of a `ModelSpec` that rebuilds a custom model anywhere."""

    factory: str
    options_json: str  # model.options as JSON text (the spec stays hashable and plain)
    feature_names: tuple[str, ...]
    task: TaskSpec

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    def to_json(self) -> dict[str, Any]:
        return {
            "factory": self.factory,
            "options": self.options,
            "feature_names": list(self.feature_names),
            "task": self.task.name,
            "classes": list(self.task.classes),
        }

    @staticmethod
    def from_json(raw: dict[str, Any], output_dim: int) -> CustomModel:
        return CustomModel(
            raw["factory"],
            json.dumps(raw.get("options", {}), sort_keys=True),
            tuple(raw["feature_names"]),
            TaskSpec(raw["task"], output_dim, tuple(raw.get("classes", ()))),
        )


def split_reference(reference: str) -> tuple[str, str]:
    """'package.module:function' -> ('package.module', 'function'), or a config error."""
    module, sep, attr = reference.partition(":")
    if (
        not sep
        or not module
        or not attr
        or not all(p.isidentifier() for p in [*module.split("."), *attr.split(".")])
    ):
        raise UserCodeError(f"model.factory={reference!r} must name a function as 'package.module:function'")
    return module, attr


def load_factory(reference: str) -> Callable[..., Any]:
    module_name, attr = split_reference(reference)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise UserCodeError(
            f"model.factory={reference!r}: cannot import {module_name} ({type(exc).__name__}: {exc}); "
            f"run the job from the directory that holds it, or put it on PYTHONPATH"
        ) from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UserCodeError(f"model.factory={reference!r}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise UserCodeError(f"model.factory={reference!r} is not callable")
    return target


def build_custom(spec_input_dim: int, custom: CustomModel):
    from torch import nn

    model = load_factory(custom.factory)(
        InputSpec(spec_input_dim, custom.feature_names), custom.task, custom.options
    )
    if not isinstance(model, nn.Module):
        raise UserCodeError(
            f"model.factory={custom.factory!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def check_custom_model(spec_input_dim: int, custom: CustomModel) -> None:
    """Build the model once on the driver and run two rows through it: the output shape the task
    needs, or an error that names the factory, the shape it gave and the one wanted."""
    import torch

    model = build_custom(spec_input_dim, custom)
    want = (2,) if custom.task.output_dim == 1 else (2, custom.task.output_dim)
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros(2, spec_input_dim))
    except Exception as exc:
        raise UserCodeError(
            f"model.factory={custom.factory!r}: the model fails on a float32 [2, {spec_input_dim}] "
            f"batch: {type(exc).__name__}: {exc}"
        ) from None
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != want:
        raise UserCodeError(
            f"model.factory={custom.factory!r}: a {custom.task.name} model must map [rows, {spec_input_dim}] to "
            f"[rows{'' if custom.task.output_dim == 1 else f', {custom.task.output_dim}'}], it returned {got} for 2 "
            f"rows; use task.output_dim outputs" + (" and squeeze the last dimension" if want == (2,) else "")
        )


def code_root(reference: str) -> Path:
    """What must travel for the factory to import elsewhere: its top-level package directory, or
    the module's own file."""
    module_name, _ = split_reference(reference)
    top = importlib.import_module(module_name.split(".")[0])
    file = getattr(top, "__file__", None)
    if not file:
        raise UserCodeError(
            f"model.factory={reference!r}: {module_name.split('.')[0]} has no file to ship "
            f"(a namespace package); give it an __init__.py"
        )
    path = Path(file).resolve()
    path = path.parent if path.name == "__init__.py" else path
    archive = next((p for p in path.parents if p.suffix == ".zip" and p.is_file()), None)
    return _unzipped(archive, path.relative_to(archive)) if archive is not None else path


def _unzipped(archive: Path, inner: Path) -> Path:
    """Code imported from a zip (shipped with addPyFile, e.g. when fine-tuning a registered custom
    model) as files again, for MLflow's code_paths."""
    import zipfile

    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "sparkml-dist-code" / f"unzipped-{digest}"
    if not (out / inner).exists():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(out)
    return out / inner


def _is_site_package(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def shippable(path: Path) -> Path:
    """A file addPyFile takes: the module file itself, or a package zipped (content-addressed, so
    the same code always has the same path and Spark does not see a second, different file)."""
    if path.is_file():
        return path
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*.py")):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(file.read_bytes())
    out = Path(tempfile.gettempdir()) / "sparkml-dist-code" / digest.hexdigest()[:16]
    archive = out / f"{path.name}.zip"
    if not archive.exists():
        out.mkdir(parents=True, exist_ok=True)
        partial = shutil.make_archive(str(out / f".{path.name}"), "zip", path.parent, path.name)
        Path(partial).replace(archive)
    return archive


def ship_factory(spark, reference: str) -> None:
    """The train stage's first step for a custom model: import the factory here (a clear error if it
    cannot be), then send its code to the executors."""
    load_factory(reference)
    ship_code(spark, [code_root(reference)])


def ship_code(spark, paths) -> None:
    """Make code importable by this application's executors (and, as addPyFile does, the driver).
    Installed packages (site-packages) are left alone: the executors have them from the same install."""
    for raw in paths:
        path = Path(raw)
        if _is_site_package(path.resolve()):
            continue
        if is_connect(spark):  # a Connect client ships Python files as session artifacts
            spark.addArtifacts(str(shippable(path)), pyfile=True)
        else:
            spark.sparkContext.addPyFile(str(shippable(path)))
