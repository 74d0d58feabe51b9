"""An activity's JSON input, validated where it arrives: the activities work under any payload
converter (the frameworks' own included) and refuse a malformed input in one line, not retried."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ApplicationError

from agentlease.enums import FailureType
from agentlease.errors import describe_validation_error

_M = TypeVar("_M", bound=BaseModel)


def activity_input(model: type[_M], payload: Any, what: str, failure: FailureType) -> _M:
    """``payload`` validated as ``model``; else a non-retryable ApplicationError of type ``failure``."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApplicationError(
            f"{what}: {describe_validation_error(exc)}", type=failure.value, non_retryable=True
        ) from None
