"""The lease metrics' Prometheus families (``docs/metrics.md``), imported on first use by
:mod:`agentlease.observability.metrics` and read there (``metrics.LEASE_CLAIMS``...)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SCOPE = ("namespace", "task_queue")
"""The labels every lease metric starts with: the recording worker's namespace and task queue (empty outside one)."""

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
    "Attempts delivered for a task another attempt holds (lease_held) or that already settled (settled); "
    "downstream answers that an earlier request with the key still runs (key_in_flight: the attempt waited).",
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
APPROVALS_EXPIRING = Counter(
    "agentlease_approvals_expiring",
    "Approvals not yet consumed that the sweeper found about to lapse (an approval_expiring entry each), by what "
    "they wait for: person (more approvers) or claim (the approved call has not started).",
    [*SCOPE, "tool", "waiting_for"],
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
