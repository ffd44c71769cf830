"""Load YAML, apply `--set key=value` overrides, validate once with errors that name the key."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

from sparkml_dist.config.header import complete_columns, needs_inference
from sparkml_dist.config.overrides import apply_overrides
from sparkml_dist.config.reference import all_keys
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


__all__ = ["apply_overrides", "load_config", "parse_config"]


def parse_config(raw: dict, source: str = "<config>") -> JobConfig:
    """Validate `raw`; a CSV with a header gets the columns it leaves out from that header
    (config/header.py)."""
    if needs_inference(raw.get("data")):
        raw = complete_columns(raw)
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


# Optuna's and Ray Tune's users write a range the way their library spells it
_RANGE_FORMS = (
    "a range is {loguniform: [low, high]}, {uniform: [low, high]} (step: n), {int: [low, high]} "
    "(log: true, step: n) or {choice: [values]}; Optuna's suggest_float(name, low, high, log=True) is "
    "{loguniform: [low, high]} (docs/tuning.md)"
)


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: {exc.error_count()} invalid config value(s):"]
    range_forms_shown = False
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<top level>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and err["loc"][:2] == ("tune", "space") and len(err["loc"]) == 4:
            msg = "unknown key; " + ("see above" if range_forms_shown else _RANGE_FORMS)
            range_forms_shown = True
        elif err["type"] == "extra_forbidden":
            msg = f"unknown key;{_did_you_mean(err['loc'])} check its spelling against docs/configuration.md"
            if err["loc"][0] == "train":
                msg += " (keys under train depend on train.strategy)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        got = err.get("input")
        shown = "" if err["type"] in ("missing",) or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple) -> str:
    """' did you mean <key>?' for a misspelt key whose section has one close to it, else ''."""

    parent = "".join("[]" if isinstance(p, int) else f".{p}" for p in loc[:-1]).lstrip(".")
    keys = all_keys() | set(JobConfig.model_fields)
    siblings = {k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(str(loc[-1]), sorted(siblings), n=1, cutoff=0.6)
    return f" did you mean {'.'.join(str(p) for p in (*loc[:-1], close[0]))}?" if close else ""
