"""Lease metrics (Prometheus), recorded by the ledger and the leased activity, served with Temporal's runtime
metrics at ``AGENTLEASE_METRICS_ADDRESS`` (:class:`MetricsServer`). Each metric and what to alert on:
``docs/metrics.md``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agentlease.errors import ConfigurationError
from agentlease.settings import parse_address

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

NONE = "none"
"""Label value of a stage that was never recorded."""


def _families() -> Any:
    from agentlease.observability import _metric_families  # imported on first use

    return _metric_families


def __getattr__(name: str) -> Any:
    """The metric families and :data:`SCOPE` (``LEASE_CLAIMS``...), from :mod:`._metric_families`."""
    if name.isupper() and not name.startswith("_") and hasattr(_families(), name):
        return getattr(_families(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def stage_label(stage: object) -> str:
    """A stage (enum, string or ``None``) as a label value."""
    if stage is None:
        return NONE
    return str(getattr(stage, "value", stage))


class LeaseMetrics:
    """What the ledger and the leased activity report, one call per operation, with ``namespace`` and
    ``task_queue`` as the :data:`SCOPE` labels (default empty: :data:`LEASE_METRICS`; a worker's are scoped)."""

    def __init__(self, *, namespace: str = "", task_queue: str = "") -> None:
        self._scope = (namespace, task_queue)
        self.namespace = namespace
        self.task_queue = task_queue
        self._children: dict[tuple[str, tuple[object, ...]], Any] = {}

    def _child(self, family: str, *labels: object) -> Any:
        """The child of the family named ``family`` (``"LEASE_CLAIMS"``...) for this scope and ``labels``, looked
        up in prometheus_client once and kept: it holds every child it made for good, so this keeps no more."""
        key = (family, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(_families(), family).labels(*self._scope, *labels)
        return child

    def claim(
        self,
        tool: str,
        outcome: str,
        *,
        seconds: float | None = None,
        superseded_stage: object = None,
        superseded: bool = False,
        traced: bool = True,
    ) -> None:
        """A claim asked of the ledger: ``granted`` (in ``seconds``; ``superseded``: over a lapsed lease last
        seen in ``superseded_stage``; ``traced``: with a Temporal trace link), ``held`` or ``closed``."""
        self._child("LEASE_CLAIMS", tool, outcome).inc()
        if outcome != "granted":
            return
        if seconds is not None:
            self._child("LEASE_ACQUISITION", tool).observe(seconds)
        if superseded:
            self._child("LEASES_EXPIRED", tool, stage_label(superseded_stage), "takeover").inc()
        if not traced:
            self._child("CLAIMS_WITHOUT_TRACE", tool).inc()

    def renewal(self, tool: str, stage: object, *, renewed: bool) -> None:
        """A renewal (or stage change), granted or lost."""
        self._child("LEASE_RENEWALS", tool, stage_label(stage), "renewed" if renewed else "lost").inc()

    def settle(self, tool: str, *, settled: bool, renewals: int | None = None) -> None:
        """A settle: ``settled`` with the task's renewal count, or refused (``late_unapplied``)."""
        self._child("SETTLEMENTS", tool, "settled" if settled else "late_unapplied").inc()
        if settled and renewals is not None:
            self._child("RENEWALS_PER_TASK", tool).observe(renewals)

    def lease_end(self, tool: str, status: object, error_class: object) -> None:
        """A holder ended its lease: released (a retry, by error class) or parked until a person decides."""
        value = stage_label(status)
        if value == "released":
            self._child("LEASE_RELEASES", tool, stage_label(error_class)).inc()
        else:
            self._child("TASKS_PARKED", tool, value).inc()

    def expiry(self, tool: str, stage: object, *, by: str, parked: object = None) -> None:
        """A lapsed lease recorded (by the sweeper), and the status it parked the task in, if any."""
        self._child("LEASES_EXPIRED", tool, stage_label(stage), by).inc()
        if parked is not None:
            self._child("TASKS_PARKED", tool, stage_label(parked)).inc()

    def duplicate_delivery(self, tool: str, reason: str) -> None:
        """An attempt delivered for a task another attempt holds (``lease_held``) or that settled (``settled``)."""
        self._child("DUPLICATE_DELIVERIES", tool, reason).inc()

    def settlement_latency(self, tool: str, seconds: float) -> None:
        """Seconds from entering ``commit`` to a durable settle."""
        self._child("SETTLEMENT_LATENCY", tool).observe(seconds)

    def ledger_unavailable(self, tool: str, operation: str) -> None:
        """A ledger operation failed because the ledger could not be reached."""
        self._child("LEDGER_UNAVAILABLE", tool or NONE, operation).inc()

    def deferred_writes(self, pending: int) -> None:
        """How many writes wait for the ledger to come back."""
        self._child("LEDGER_DEFERRED_WRITES").set(pending)

    def ambiguity_resolved(self, tool: str, by: str, outcome: str) -> None:
        """An ambiguous task resolved ``by`` ``probe`` or ``person``: ``happened``, ``not_happened``, ``abandoned``."""
        self._child("AMBIGUITIES_RESOLVED", tool or NONE, by, outcome).inc()

    def probe(self, tool: str, answer: str) -> None:
        """A readback probe answered (``happened``, ``not_happened``, ``cannot_tell``) or ``failed``."""
        self._child("PROBES", tool, answer).inc()

    def approval(self, tool: str, outcome: str, *, remaining_s: float | None = None) -> None:
        """A claim met an approval: ``consumed`` (seconds left), ``expired``, ``mismatched``, ``missing``."""
        self._child("APPROVALS", tool, outcome).inc()
        if remaining_s is not None:
            self._child("APPROVAL_REMAINING", tool).observe(remaining_s)

    def approval_expiring(self, tool: str, waiting_for: str) -> None:
        """An approval not yet consumed lapses soon; it waits for a ``person`` or for its ``claim``."""
        self._child("APPROVALS_EXPIRING", tool, waiting_for).inc()

    def heartbeat_timeout_changed(self, tool: str, *, shorter: bool) -> None:
        """A heartbeat timeout that is not the lease TTL was found under a lease."""
        self._child("HEARTBEAT_TIMEOUT_CHANGES", tool, "shorter" if shorter else "longer").inc()


LEASE_METRICS = LeaseMetrics()
"""The process's lease metrics."""


class MetricsServer:
    """The ``GET /metrics`` endpoint of one process on ``address`` (``HOST:PORT``; port 0: a free one, see
    :attr:`port`), on its own thread, exposing ``registry`` (default the process's, with the lease metrics).
    ConfigurationError: bad address, or it cannot be bound."""

    def __init__(self, address: str, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, start_http_server

        _families()  # the lease metrics are in the registry it serves, recorded yet or not
        registry = REGISTRY if registry is None else registry
        host, port = parse_address(address)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None
        self.host = host
        self.port: int = self._server.server_port

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class ForwardedMetrics:
    """A collector re-exporting the endpoint ``url`` (Temporal's runtime metrics), read once per scrape within
    ``timeout_s`` (2s); one that does not answer adds nothing."""

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def describe(self) -> list[Metric]:
        return []  # not known in advance: never checked against the registry's names

    def collect(self) -> Iterator[Metric]:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8")
        except OSError:
            return
        yield from text_string_to_metric_families(text)


class _Chain:
    """Every metric of ``registry``, then those of ``extra`` (one exposition)."""

    def __init__(self, registry: CollectorRegistry, extra: ForwardedMetrics) -> None:
        self._registry = registry
        self._extra = extra

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        yield from self._extra.collect()


@contextmanager
def serving_metrics(address: str | None, *, forward: str | None = None) -> Iterator[MetricsServer | None]:
    """Serve the lease metrics on ``address`` (``HOST:PORT``; ``None``: not served) during the block, with the
    samples of the endpoint ``forward`` (Temporal's runtime metrics). ConfigurationError: see :class:`MetricsServer`."""
    if address is None:
        yield None
        return
    from prometheus_client import REGISTRY, CollectorRegistry

    _families()
    registry = REGISTRY
    if forward is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Chain(REGISTRY, ForwardedMetrics(forward)))
    server = MetricsServer(address, registry=registry)
    try:
        yield server
    finally:
        server.close()


__all__ = ["LEASE_METRICS", "ForwardedMetrics", "LeaseMetrics", "MetricsServer", "serving_metrics", "stage_label"]
