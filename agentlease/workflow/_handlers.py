"""What the run's query, update and signal handlers share: payloads parsed into models with a one-line
error, and signatures resolved once per process."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from types import CodeType
from typing import Any, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from agentlease.errors import describe_validation_error
    from agentlease.security.codec import undecodable

ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_payload(model: type[ModelT], payload: Any, what: str) -> ModelT:
    """A handler's payload (plain JSON, for any payload converter) as ``model``, else a one-line ``ValueError``."""
    if isinstance(payload, model):
        return payload
    if (why := undecodable(payload)) is not None:  # a worker's codec could not open it (agentlease.security.codec)
        raise ValueError(f"undecodable {what} payload: {why}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ValueError(f"bad {what} payload: {describe_validation_error(exc)}") from None


_HINTS: dict[CodeType, tuple[inspect.Signature, dict[str, Any]]] = {}


def resolved(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` with its signature and type hints resolved once per process (by its code), not per run."""
    function: Any = getattr(handler, "__func__", handler)
    known = _HINTS.get(function.__code__)
    if known is None:
        known = (inspect.signature(function, eval_str=True), typing.get_type_hints(function))
        _HINTS[function.__code__] = known
    function.__signature__, function.__annotations__ = known
    return handler


__all__ = ["parse_payload", "resolved"]
