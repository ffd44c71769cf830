"""Load YAML, apply `--set key=value` overrides, validate once with errors that name the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.errors import ConfigError


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> JobConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass --config conf/<name>.yaml)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (data, train, ...)")
    return parse_config(apply_overrides(raw, overrides), source=str(path))


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """Return a copy of `raw` with each `a.b.c=value` set; the value is parsed as YAML."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set '{item}': expected key=value, e.g. --set train.epochs=3")
        _set_path(out, key.strip().split("."), _parse_value(text), item)
    return out


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _set_path(tree: dict, parts: list[str], value: Any, item: str) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set '{item}': '{where}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_config(raw: dict, source: str = "<config>") -> JobConfig:
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: {exc.error_count()} invalid config value(s):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<top level>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key; check its spelling against conf/adult.yaml and docs/configuration.md"
        elif err["type"] == "missing":
            msg = "required key is missing"
        got = err.get("input")
        shown = "" if err["type"] in ("missing",) or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)
