"""The Spark session and what a job asks of it. Exports load on first use: `spark.kind` (which
kind of session) is read by code that must not import the session builder's config schema."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkml_dist.spark.session import build_session, check_java, task_slots

__all__ = ["build_session", "check_java", "task_slots"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("sparkml_dist.spark.session"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
