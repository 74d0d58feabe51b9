"""OpenTelemetry spans of ledger operations, inside Temporal's activity spans (``AGENTLEASE_TRACING``, off by
default; while off nothing imports OpenTelemetry and a ledger call costs one global's check). ``docs/tracing.md``."""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from agentlease.errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

SPAN_PREFIX = "agentlease.ledger."
"""Ledger spans are named ``agentlease.ledger.<operation>`` (``claim``, ``renew``, ``settle``...)."""

ATTRIBUTES = {
    "task_id": "agentlease.task_id",
    "generation": "agentlease.claim_generation",
    "stage": "agentlease.stage",
    "idempotency_key": "agentlease.idempotency_key",
    "tool": "agentlease.tool",
    "decision": "agentlease.decision",
}
"""The span attributes of a ledger operation, by fact. Never the lease token."""

NO_STAGE = "none"
"""The ``agentlease.stage`` of an operation on a task that has recorded no stage yet."""

_tracer: Any = None
"""The tracer ledger spans are made with; ``None`` while tracing is off (the hot path's one check)."""

_provider: Any = None
"""The tracer provider :func:`configure_tracing` installed itself (flushed by :func:`flush`)."""

_MISSING = (
    "tracing needs OpenTelemetry: install the otel extra (pip install 'agentlease[otel]'), or set "
    "AGENTLEASE_TRACING=false"
)


def enabled() -> bool:
    """Whether ledger operations are traced in this process."""
    return _tracer is not None


def enable(tracer: Any = None) -> None:
    """Trace ledger operations with ``tracer`` (default the global provider's); ConfigurationError without OTel."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        raise ConfigurationError(_MISSING) from None
    _tracer = tracer or trace.get_tracer("agentlease.ledger")


def disable() -> None:
    """Stop tracing ledger operations (the spans already ended stay with their exporter)."""
    global _tracer
    _tracer = None


def configure_tracing() -> None:
    """Turn tracing on: unless a tracer provider is set, an SDK one from the ``OTEL_*`` variables exporting over
    OTLP (if installed), then :func:`enable`; ``OTEL_SDK_DISABLED=true`` leaves it off.
    ConfigurationError: OpenTelemetry's SDK is not installed."""
    global _provider
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import OTEL_SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigurationError(_MISSING) from None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # nobody set one yet
        name = os.environ.get(OTEL_SERVICE_NAME) or "agentlease"
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            pass  # spans are made (trace ids reach the ledger) but go nowhere
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _provider = provider
    enable()


def flush(timeout_ms: int = 5000) -> None:
    """Export the spans still buffered by the provider :func:`configure_tracing` installed (before exit)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def temporal_interceptors() -> list[Any]:
    """Temporal's ``TracingInterceptor`` while tracing is on; otherwise none."""
    if _tracer is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


def current_trace_id() -> str | None:
    """The current span's trace id (32 lowercase hex digits); ``None`` while off or outside any span."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def annotate_stage(stage: Any) -> None:
    """Tag the current ledger span with the stage the ledger recorded (no-op while tracing is off)."""
    if _tracer is None or stage is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attribute(ATTRIBUTES["stage"], _text(stage))


def _text(value: Any) -> str:
    """An enum's value, or anything else, as text."""
    return str(getattr(value, "value", value))


def _facts(value: Any) -> dict[str, Any]:
    """The span attributes a claim, a task spec or a task record carries."""
    facts: dict[str, Any] = {}
    for fact, names in (
        ("task_id", ("task_id",)),
        ("generation", ("generation", "claim_generation")),
        ("idempotency_key", ("idempotency_key",)),
        ("tool", ("tool",)),
    ):
        for name in names:
            found = getattr(value, name, None)
            if isinstance(found, str | int) and not isinstance(found, bool):
                facts[ATTRIBUTES[fact]] = found
                break
    stage = getattr(value, "stage", None) or getattr(value, "previous_stage", None)
    if stage is not None:
        facts[ATTRIBUTES["stage"]] = _text(stage)
    return facts


def traced(operation: str) -> Callable[[F], F]:
    """Make a ``Ledger`` method a span ``agentlease.ledger.<operation>``, its attributes from the first argument
    (claim, task spec or task id), ``stage``, a decision kind and the result; awaited directly while off."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _tracer is None:  # the method's own coroutine: no frame of ours on the lease's hot path
                return method(self, *args, **kwargs)
            return spanned(_tracer, self, *args, **kwargs)

        async def spanned(tracer: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
            subject = args[0] if args else None
            attributes = {ATTRIBUTES["task_id"]: subject} if isinstance(subject, str) else _facts(subject)
            stage = "settled" if operation == "settle" else kwargs.get("stage")
            if stage is not None:
                attributes[ATTRIBUTES["stage"]] = _text(stage)
            attributes.setdefault(ATTRIBUTES["stage"], NO_STAGE)  # until the ledger says (annotate_stage)
            if operation == "decide" and len(args) > 1:
                attributes[ATTRIBUTES["decision"]] = _text(args[1])
            with tracer.start_as_current_span(SPAN_PREFIX + operation, attributes=attributes) as span:
                result = await method(self, *args, **kwargs)
                answered = _facts(result)
                if answered:
                    span.set_attributes(answered)
                return result

        return cast(F, wrapper)

    return decorate


__all__ = [
    "ATTRIBUTES",
    "NO_STAGE",
    "SPAN_PREFIX",
    "annotate_stage",
    "configure_tracing",
    "current_trace_id",
    "disable",
    "enable",
    "enabled",
    "flush",
    "temporal_interceptors",
    "traced",
]
