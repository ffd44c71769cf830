"""`--set key=value` overrides on a raw (not yet validated) config mapping."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import yaml

from sparkml_dist.errors import ConfigError


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
        if child is None:  # a section written as `key:` with nothing under it
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set '{item}': '{where}' is a value, not a section")
        node = child
    node[parts[-1]] = value
