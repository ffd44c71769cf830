"""What every config section shares: unknown keys are errors, values frozen; and a validation
error placed at a key, so that its message names the key."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


class Section(BaseModel):
    """A config section: unknown keys are errors, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def error_at(loc: tuple[str, ...], value: Any, error: Exception) -> ValidationError:
    """A validation error at `loc` (under the field being validated, or from the top when raised by
    the whole config's validator), so the message names the key."""
    line: InitErrorDetails
    if isinstance(error, PydanticCustomError):
        line = {
            "type": PydanticCustomError(error.type, error.message_template, error.context),
            "loc": loc,
            "input": value,
        }
    else:
        line = {"type": "value_error", "loc": loc, "input": value, "ctx": {"error": error}}
    return ValidationError.from_exception_data("JobConfig", [line])
