"""Lease metrics for operators (Prometheus): what to watch when leases matter (``docs/metrics.md``).

Recorded in the process that does the work: the ledger records claims, renewals, settles,
releases, parking and expiries as it writes them; the leased activity records what only the worker
sees (duplicate deliveries, settlement latency). A worker serves them when
``AGENTLEASE_METRICS_ADDRESS`` is set (:class:`MetricsServer`).

| question | metric |
|---|---|
| lease acquisition latency | ``agentlease_lease_acquisition_seconds{tool}`` |
| lease renewal count per task | ``agentlease_lease_renewals_per_task{tool}`` (observed at settle), |
| | ``agentlease_lease_renewals_total{tool,stage,outcome}`` |
| tasks expired by stage | ``agentlease_leases_expired_total{tool,stage,by}`` |
| duplicate delivery count | ``agentlease_duplicate_deliveries_total{tool,reason}`` |
| retry count by error class | ``agentlease_lease_releases_total{tool,error_class}`` |
| settlement latency after external commit | ``agentlease_settlement_latency_seconds{tool}`` |
| dead-letter rate by tool | ``agentlease_tasks_parked_total{tool,status="dead_lettered"}`` |
| tasks with missing trace links | ``agentlease_claims_without_trace_total{tool}`` |
| ledger outages seen by a worker | ``agentlease_ledger_unavailable_total{tool,operation}`` |
| writes waiting for the ledger to come back | ``agentlease_ledger_deferred_writes`` (gauge) |
| ambiguities resolved by a probe vs a person | ``agentlease_ambiguities_resolved_total{tool,by,outcome}`` |
| what probes answered | ``agentlease_probes_total{tool,answer}`` |
| approvals consumed, expired, refused | ``agentlease_approvals_total{tool,outcome}`` |
| how close approvals come to expiring | ``agentlease_approval_remaining_seconds{tool}`` |
| heartbeat timeouts changed under a lease | ``agentlease_heartbeat_timeout_changes_total{tool,direction}`` |

Also: ``agentlease_lease_claims_total{tool,outcome}`` and ``agentlease_settlements_total{tool,outcome}``
(``late_unapplied`` counts the results of superseded attempts, G10).

Label values are bounded: tool names, the five stages, the task statuses and error classes of
:mod:`agentlease.enums`. Task ids never become labels. Every metric also starts with the
:data:`SCOPE` labels ``namespace`` and ``task_queue`` of the worker that recorded it, the names
Temporal's runtime metrics use, and a worker can serve those on the same endpoint
(:class:`ForwardedMetrics`; ``docs/metrics.md``).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agentlease.errors import ConfigurationError

NONE = "none"
"""Label value of a stage that was never recorded."""

SCOPE = ("namespace", "task_queue")
"""The labels every lease metric starts with: the Temporal namespace and task queue of the worker that
recorded it, as Temporal's own runtime metrics label theirs (empty outside a worker: the CLI, the
sweeper)."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_COUNT_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 500)

LEASE_CLAIMS = Counter(
    "agentlease_lease_claims",
    "Claims asked of the ledger, by outcome: granted, held (another lease is valid), closed (settled, "
    "cancelled or waiting for a decision).",
    [*SCOPE, "tool", "outcome"],
)
LEASE_ACQUISITION = Histogram(
    "agentlease_lease_acquisition_seconds",
    "Time a granted claim took as its worker waited for it (seconds, worker's monotonic clock), "
    "including the wait for the ledger's connection or write lock.",
    [*SCOPE, "tool"],
    buckets=_LATENCY_BUCKETS,
)
LEASE_RENEWALS = Counter(
    "agentlease_lease_renewals",
    "Renewals (stage changes included), by the stage recorded and outcome: renewed or lost.",
    [*SCOPE, "tool", "stage", "outcome"],
)
RENEWALS_PER_TASK = Histogram(
    "agentlease_lease_renewals_per_task",
    "Renewals a task's leases took over all its attempts, observed when it settles.",
    [*SCOPE, "tool"],
    buckets=_COUNT_BUCKETS,
)
LEASES_EXPIRED = Counter(
    "agentlease_leases_expired",
    "Leases that lapsed without settle or release, by the last durable stage and who found it: "
    "takeover (a later claim) or sweeper. Expiry in commit is a correctness risk.",
    [*SCOPE, "tool", "stage", "by"],
)
DUPLICATE_DELIVERIES = Counter(
    "agentlease_duplicate_deliveries",
    "Attempts delivered for a task another attempt holds (lease_held) or that already settled (settled).",
    [*SCOPE, "tool", "reason"],
)
LEASE_RELEASES = Counter(
    "agentlease_lease_releases",
    "Leases given back for a retry, by error class (retryable, shutdown...): retries by error class.",
    [*SCOPE, "tool", "error_class"],
)
SETTLEMENTS = Counter(
    "agentlease_settlements",
    "Settle attempts by outcome: settled, or late_unapplied (the result of a superseded attempt, G10).",
    [*SCOPE, "tool", "outcome"],
)
SETTLEMENT_LATENCY = Histogram(
    "agentlease_settlement_latency_seconds",
    "Time from entering the commit stage to the settle being durable (seconds, worker's monotonic clock).",
    [*SCOPE, "tool"],
    buckets=_LATENCY_BUCKETS,
)
TASKS_PARKED = Counter(
    "agentlease_tasks_parked",
    "Tasks moved out of circulation until a person decides, by status: dead_lettered, blocked, needs_reconciliation.",
    [*SCOPE, "tool", "status"],
)
CLAIMS_WITHOUT_TRACE = Counter(
    "agentlease_claims_without_trace",
    "Granted claims with no Temporal trace link (workflow id): their evidence cannot be joined to a history.",
    [*SCOPE, "tool"],
)

LEDGER_UNAVAILABLE = Counter(
    "agentlease_ledger_unavailable",
    "Ledger operations that failed because the ledger could not be reached, by operation: claim, renew, "
    "settle, release, a park (dead_letter, blocked, needs_reconciliation), decide.",
    [*SCOPE, "tool", "operation"],
)
AMBIGUITIES_RESOLVED = Counter(
    "agentlease_ambiguities_resolved",
    "Ambiguous tasks (an unsafe attempt that may have acted) resolved, by who: probe (the tool's readback "
    "probe, no person) or person (a reconcile decision); outcome: happened, not_happened, abandoned.",
    [*SCOPE, "tool", "by", "outcome"],
)
PROBES = Counter(
    "agentlease_probes",
    "Readback probes run, by answer: happened, not_happened, cannot_tell, failed (raised or too slow).",
    [*SCOPE, "tool", "answer"],
)
APPROVALS = Counter(
    "agentlease_approvals",
    "Approvals met by a claim, by outcome: consumed (the one execution it authorised), expired, mismatched "
    "(other arguments or tool), missing (none recorded).",
    [*SCOPE, "tool", "outcome"],
)
APPROVAL_REMAINING = Histogram(
    "agentlease_approval_remaining_seconds",
    "Time an approval had left before it expired when a claim consumed it (seconds, ledger clock): low "
    "values warn that approvals are about to expire before their calls run.",
    [*SCOPE, "tool"],
    buckets=(1.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0),
)
HEARTBEAT_TIMEOUT_CHANGES = Counter(
    "agentlease_heartbeat_timeout_changes",
    "Heartbeat timeouts changed under a running lease (temporal activity update-options), found by a renewal "
    "or a claim, by direction: shorter or longer than the lease TTL.",
    [*SCOPE, "tool", "direction"],
)

LEDGER_DEFERRED_WRITES = Gauge(
    "agentlease_ledger_deferred_writes",
    "Settles, releases and parks this worker could not write during a ledger outage, waiting to be "
    "recorded when the ledger is back.",
    list(SCOPE),
)


def stage_label(stage: object) -> str:
    """A stage (enum, string or ``None``) as a label value."""
    if stage is None:
        return NONE
    return str(getattr(stage, "value", stage))


class LeaseMetrics:
    """What the ledger and the leased activity report: one call per operation.

    The ledger holds one (default :data:`LEASE_METRICS`, unscoped); a worker's ledger holds one
    scoped to the worker's namespace and task queue.

    Args:
        namespace / task_queue: the values of the :data:`SCOPE` labels. Default empty.
    """

    def __init__(self, *, namespace: str = "", task_queue: str = "") -> None:
        self._scope = (namespace, task_queue)
        self.namespace = namespace
        self.task_queue = task_queue

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
        """A claim asked of the ledger: ``granted``, ``held`` or ``closed``.

        Args:
            seconds: how long a granted claim took.
            superseded / superseded_stage: it took over a lapsed lease, last seen in that stage.
            traced: the claim carries a Temporal trace link.
        """
        LEASE_CLAIMS.labels(*self._scope, tool, outcome).inc()
        if outcome != "granted":
            return
        if seconds is not None:
            LEASE_ACQUISITION.labels(*self._scope, tool).observe(seconds)
        if superseded:
            LEASES_EXPIRED.labels(*self._scope, tool, stage_label(superseded_stage), "takeover").inc()
        if not traced:
            CLAIMS_WITHOUT_TRACE.labels(*self._scope, tool).inc()

    def renewal(self, tool: str, stage: object, *, renewed: bool) -> None:
        """A renewal (or stage change), granted or lost."""
        LEASE_RENEWALS.labels(*self._scope, tool, stage_label(stage), "renewed" if renewed else "lost").inc()

    def settle(self, tool: str, *, settled: bool, renewals: int | None = None) -> None:
        """A settle: ``settled`` with the task's renewal count, or refused (``late_unapplied``)."""
        SETTLEMENTS.labels(*self._scope, tool, "settled" if settled else "late_unapplied").inc()
        if settled and renewals is not None:
            RENEWALS_PER_TASK.labels(*self._scope, tool).observe(renewals)

    def lease_end(self, tool: str, status: object, error_class: object) -> None:
        """A holder ended its lease: released (a retry, by error class) or parked until a person decides."""
        value = stage_label(status)
        if value == "released":
            LEASE_RELEASES.labels(*self._scope, tool, stage_label(error_class)).inc()
        else:
            TASKS_PARKED.labels(*self._scope, tool, value).inc()

    def expiry(self, tool: str, stage: object, *, by: str, parked: object = None) -> None:
        """A lapsed lease recorded (by the sweeper), and the status it parked the task in, if any."""
        LEASES_EXPIRED.labels(*self._scope, tool, stage_label(stage), by).inc()
        if parked is not None:
            TASKS_PARKED.labels(*self._scope, tool, stage_label(parked)).inc()

    def duplicate_delivery(self, tool: str, reason: str) -> None:
        """An attempt delivered for a task another attempt holds (``lease_held``) or that settled (``settled``)."""
        DUPLICATE_DELIVERIES.labels(*self._scope, tool, reason).inc()

    def settlement_latency(self, tool: str, seconds: float) -> None:
        """Seconds from entering ``commit`` to a durable settle."""
        SETTLEMENT_LATENCY.labels(*self._scope, tool).observe(seconds)

    def ledger_unavailable(self, tool: str, operation: str) -> None:
        """A ledger operation failed because the ledger could not be reached."""
        LEDGER_UNAVAILABLE.labels(*self._scope, tool or NONE, operation).inc()

    def deferred_writes(self, pending: int) -> None:
        """How many writes wait for the ledger to come back."""
        LEDGER_DEFERRED_WRITES.labels(*self._scope).set(pending)

    def ambiguity_resolved(self, tool: str, by: str, outcome: str) -> None:
        """An ambiguous task resolved ``by`` a ``probe`` or a ``person``: ``happened``, ``not_happened``,
        ``abandoned``."""
        AMBIGUITIES_RESOLVED.labels(*self._scope, tool or NONE, by, outcome).inc()

    def probe(self, tool: str, answer: str) -> None:
        """A readback probe answered (``happened``, ``not_happened``, ``cannot_tell``) or ``failed``."""
        PROBES.labels(*self._scope, tool, answer).inc()

    def approval(self, tool: str, outcome: str, *, remaining_s: float | None = None) -> None:
        """A claim met an approval: ``consumed`` (with the seconds it had left), ``expired``, ``mismatched``,
        ``missing``."""
        APPROVALS.labels(*self._scope, tool, outcome).inc()
        if remaining_s is not None:
            APPROVAL_REMAINING.labels(*self._scope, tool).observe(remaining_s)

    def heartbeat_timeout_changed(self, tool: str, *, shorter: bool) -> None:
        """A heartbeat timeout that is not the lease TTL was found under a lease."""
        HEARTBEAT_TIMEOUT_CHANGES.labels(*self._scope, tool, "shorter" if shorter else "longer").inc()


LEASE_METRICS = LeaseMetrics()
"""The process's lease metrics."""


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, meaning all interfaces) as ``(host, port)``.

    Raises:
        ConfigurationError: not ``HOST:PORT`` with a port in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigurationError(f"bad metrics address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class MetricsServer:
    """The Prometheus exposition endpoint of one process (``GET /metrics``), on its own thread.

    Args:
        address: ``HOST:PORT``; port 0 picks a free one (see :attr:`port`).
        registry: what to expose. Default the process's registry, which holds the lease metrics.

    Raises:
        ConfigurationError: bad address, or it cannot be bound (in use, not local...).
    """

    def __init__(self, address: str, registry: CollectorRegistry = REGISTRY) -> None:
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
    """A collector that re-exports the samples of another Prometheus endpoint (Temporal's runtime metrics).

    Each scrape of the endpoint that serves it reads ``url`` once (timeout ``timeout_s``, default 2s);
    an endpoint that does not answer adds nothing to that scrape.
    """

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def describe(self) -> list[Metric]:
        return []  # not known in advance: never checked against the registry's names

    def collect(self) -> Iterator[Metric]:
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
    """Serve the lease metrics on ``address`` for the duration of the block; ``None``: not served.

    Args:
        address: ``HOST:PORT``, or ``None``.
        forward: the URL of another Prometheus endpoint (Temporal's runtime metrics, see
            :func:`agentlease.temporal.prometheus_runtime`) whose samples the same endpoint serves too.

    Raises:
        ConfigurationError: see :class:`MetricsServer`.
    """
    if address is None:
        yield None
        return
    registry = REGISTRY
    if forward is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Chain(REGISTRY, ForwardedMetrics(forward)))
    server = MetricsServer(address, registry=registry)
    try:
        yield server
    finally:
        server.close()


__all__ = [
    "AMBIGUITIES_RESOLVED",
    "APPROVALS",
    "APPROVAL_REMAINING",
    "CLAIMS_WITHOUT_TRACE",
    "DUPLICATE_DELIVERIES",
    "HEARTBEAT_TIMEOUT_CHANGES",
    "LEASES_EXPIRED",
    "LEASE_ACQUISITION",
    "LEASE_CLAIMS",
    "LEASE_METRICS",
    "LEASE_RELEASES",
    "LEASE_RENEWALS",
    "LEDGER_DEFERRED_WRITES",
    "LEDGER_UNAVAILABLE",
    "PROBES",
    "RENEWALS_PER_TASK",
    "SCOPE",
    "SETTLEMENTS",
    "SETTLEMENT_LATENCY",
    "TASKS_PARKED",
    "ForwardedMetrics",
    "LeaseMetrics",
    "MetricsServer",
    "parse_address",
    "serving_metrics",
    "stage_label",
]
