"""The lease context a tool runs in: an attempt that has already claimed its task.

Stages go to the ledger first, then to Temporal's heartbeat (G5), then to the run as a proven, rate-limited
progress signal (``docs/operator-views.md``); a changed heartbeat timeout is read at renewals (``docs/ttl.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError, LedgerUnavailableError
from agentlease.fencing import sign_fencing_token
from agentlease.idempotency.convention import FENCING_TOKEN_HEADER, downstream_headers
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, LeaseProgress, SettlementReceipt, StoredReceipt
from agentlease.recovery._policy import RecoveryDecision
from agentlease.runtime.names import LEASE_PROGRESS_SIGNAL
from agentlease.security.progress import prove
from agentlease.security.redaction import redact
from agentlease.security.secrets import EnvSecretProvider, ToolSecrets, ToolSettings
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._resources import ToolResources

logger = logging.getLogger("agentlease.lease")

PROGRESS_INTERVAL = 15.0
"""Seconds between progress signals of renewals that do not change the stage."""
PROGRESS_MIN_GAP = 1.0
"""Fewest seconds between two progress signals of one attempt; what changed meanwhile goes after it, latest only."""
PROGRESS_FIRST_AFTER = 1.0
"""Seconds an attempt runs before its first progress signal: each signal costs the run a workflow task."""
_MAX_REASON_CHARS = 500

HEARTBEAT_CHECK_INTERVAL = timedelta(seconds=1)
"""Least time between two reads of Temporal's heartbeat timeout by one attempt (by a renewal), from its claim."""

DESCRIBE_WAIT = timedelta(milliseconds=250)
"""How long a renewal waits for that read, at most a tenth of the lease's TTL; a later answer goes with the next."""

DESCRIBE_TIMEOUT = timedelta(seconds=5)
"""How long an attempt waits for a describe of its run."""


async def pending_activity(info: activity.Info) -> Any:
    """This attempt's activity as the run's description shows it; ``None`` if gone or no answer."""
    if info.workflow_id is None:
        return None
    handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    try:
        described = await asyncio.wait_for(handle.describe(), DESCRIBE_TIMEOUT.total_seconds())
    except Exception:  # noqa: BLE001 - what a describe tells is evidence only
        return None
    return next((p for p in described.raw_description.pending_activities if p.activity_id == info.activity_id), None)


def heartbeat_timeout_of(pending: Any) -> timedelta | None:
    """The heartbeat timeout Temporal applies to a pending activity (``None``: not said, or zero, Temporal's "no
    heartbeat timeout")."""
    if pending is None or not pending.activity_options.HasField("heartbeat_timeout"):
        return None
    return pending.activity_options.heartbeat_timeout.ToTimedelta() or None


def followed_timeout(found: timedelta | None, scheduled: timedelta | None, lease_ttl: timedelta) -> timedelta:
    """The heartbeat timeout the lease follows: its own TTL while Temporal applies the timeout the call was
    scheduled with (``found`` is ``scheduled``, or unknown), else the timeout an operator set instead (the lease
    follows it while it is shorter than the TTL: ``docs/ttl.md``)."""
    return lease_ttl if found is None or found == scheduled else found


async def attempt_heartbeat_timeout(info: activity.Info, lease_ttl: timedelta) -> timedelta:
    """The heartbeat timeout this attempt's lease follows (:func:`followed_timeout`; an attempt after the first
    reads the one Temporal applies from the run's description)."""
    assert info.heartbeat_timeout is not None
    if info.attempt <= 1 and not info.heartbeat_details:
        return lease_ttl
    found = heartbeat_timeout_of(await pending_activity(info))
    return followed_timeout(found, info.heartbeat_timeout, lease_ttl)


class Liveness:
    """Heartbeats Temporal every third of an attempt's heartbeat timeout while the attempt runs (claiming, waiting
    for a held lease, in the tool, settling), when that timeout is shorter than the lease TTL
    (:func:`~agentlease.recovery.retries.heartbeat_timeout_for`): Temporal then gives up on a stopped worker within
    that timeout, while a working attempt keeps it between its renewals, which only the lease TTL bounds. Each beat
    sends the latest details again: the attempt's own once it has some, else those the attempt before it left
    (``docs/ttl.md``, "How soon another worker takes over")."""

    def __init__(self, lease_ttl: timedelta) -> None:
        info = activity.info() if activity.in_activity() else None
        scheduled = None if info is None else info.heartbeat_timeout
        self.active = scheduled is not None and timedelta(0) < scheduled < lease_ttl
        """Whether the attempt heartbeats on its own (and so may wait for a held lease)."""
        self._scheduled = scheduled or lease_ttl
        self._inherited = () if info is None else tuple(info.heartbeat_details)
        self.context: LeaseContext | None = None
        """The attempt's lease context once it claimed: its heartbeat details and the timeout it last read."""
        self._beating: asyncio.Task[None] | None = None

    def __enter__(self) -> Liveness:
        if self.active:
            self._beating = asyncio.ensure_future(self._beat())
        return self

    def __exit__(self, *_: object) -> None:
        if self._beating is not None:
            self._beating.cancel()

    async def _beat(self) -> None:
        while True:
            timeout = self._scheduled
            if self.context is not None:
                timeout = min(timeout, self.context.heartbeat_timeout)
            await asyncio.sleep(timeout.total_seconds() / 3)
            sent = None if self.context is None else self.context.heartbeat_details
            activity.heartbeat(*((sent,) if sent is not None else self._inherited))


class LeaseHeartbeat(BaseModel):
    """Heartbeat details: the same facts the ledger recorded, for the Temporal UI."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    claim_generation: int
    stage: Stage | None
    reason: str
    lease_expires_at: datetime


class LeaseContext:
    """What a tool sees of its lease (``docs/writing-tools.md``).

    Attributes:
        claim: the lease this attempt holds (task id, generation, owner, expiry, attempts).
        previous_receipt: a receipt already stored for this idempotency key, if any.
        settings: the settings this tool may read (those it declared, or every one but the worker's own).
        secrets: this tool's own secrets: ``ctx.secrets.get("api_token")``.
        resources: what the worker's tools share (database engines by URL).
        recovery: the recovery decision; ``recovery.read_back_first``: an earlier attempt reached ``commit``,
            read back before writing.
        stage: the last stage this attempt recorded (``None`` before the first ``advance``).
        committed_at: when it entered ``commit`` (``time.perf_counter()``), for the settlement latency metric.
        confirmed_until: until when (``time.monotonic()``) the last confirmed renewal or the claim keeps the
            lease, by this worker's estimate; the ledger's clock decides.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        claim: Claim,
        side_effect_class: SideEffectClass,
        previous_receipt: StoredReceipt | None,
        settings: AgentLeaseSettings | ToolSettings,
        recovery: RecoveryDecision,
        resources: ToolResources | None = None,
        secrets: ToolSecrets | None = None,
        heartbeat_timeout: timedelta | None = None,
        progress_key: str | None = None,
        fenced: tuple[str, ...] = (),
    ) -> None:
        self._ledger = ledger
        self._progress_key = progress_key
        self.claim = claim
        self.side_effect_class = side_effect_class
        self.previous_receipt = previous_receipt
        self.settings = settings if isinstance(settings, ToolSettings) else ToolSettings(settings, claim.tool)
        self.secrets = secrets or ToolSecrets(EnvSecretProvider(), claim.tool)
        self.resources = resources or ToolResources()
        self.recovery = recovery
        self.fenced = fenced
        """The base URLs of the downstreams the tool declared it writes to (``fenced=``): its httpx requests there
        carry :meth:`downstream_headers` of the idempotency key."""
        self.stage: Stage | None = None
        self.committed_at: float | None = None
        self.confirmed_until = time.monotonic() + claim.lease_ttl.total_seconds()
        self._lost: LeaseLostError | None = None
        self._unavailable: LedgerUnavailableError | None = None
        self._progress_sent_at: float | None = None
        self._progress_first_at = time.monotonic() + PROGRESS_FIRST_AFTER
        self._progress_next: tuple[Stage | None, str] | None = None  # the stage and reason not sent yet
        self._progress_sender: asyncio.Task[None] | None = None
        self.heartbeat_timeout = heartbeat_timeout or claim.lease_ttl
        """The heartbeat timeout the lease follows (:func:`followed_timeout`), as last read: the lease TTL unless an
        operator changed Temporal's (the claim recorded it when it differed)."""
        self.heartbeat_details: dict[str, Any] | None = None
        """The details of this attempt's last heartbeat (a :class:`LeaseHeartbeat`), sent again by its liveness."""
        self._timeout_check: asyncio.Task[timedelta | None] | None = None
        self._next_timeout_check = time.monotonic() + HEARTBEAT_CHECK_INTERVAL.total_seconds()
        self._tell_run(None, "claimed")

    @property
    def fencing_token(self) -> int:
        """The claim generation, to send to fenced downstream systems (``Fencing-Token``)."""
        return self.claim.generation

    def signed_fencing_token(self, resource: str) -> str:
        """The fencing token ``<generation>.<signature>`` for ``resource``, as a downstream with the fencing key
        verifies it (``docs/security.md``); ``ValueError``: no ``AGENTLEASE_FENCING_KEY``, or a bad resource."""
        if self.settings.fencing_key is None:
            raise ValueError("no fencing key is configured (AGENTLEASE_FENCING_KEY)")
        key = self.settings.fencing_key.get_secret_value().encode("utf-8")
        return sign_fencing_token(key, resource, self.fencing_token)

    @property
    def idempotency_key(self) -> str:
        """Identity of the logical action, stable across attempts (G4)."""
        return self.claim.idempotency_key

    @property
    def worker_identity(self) -> str:
        """The ``lease_owner`` of this attempt."""
        return self.claim.owner

    @property
    def previous_stage(self) -> Stage | None:
        """The furthest stage an earlier attempt reached, as the ledger recorded it (``None``: none ran)."""
        return self.claim.previous_stage

    @property
    def lease_lost(self) -> bool:
        """True once a renewal was refused; the tool must start no new side effect."""
        return self._lost is not None

    @property
    def ledger_unavailable(self) -> bool:
        """True while the last renewal failed with :class:`LedgerUnavailableError`: the lease is not confirmed,
        start no new side effect. A later renewal that succeeds clears it."""
        return self._unavailable is not None

    def downstream_headers(self, resource: str | None = None) -> dict[str, str]:
        """The headers of a write to a downstream that follows the project's HTTP convention (``docs/edge.md``):
        ``Idempotency-Key`` and ``Fencing-Token`` (the claim generation, signed for ``resource`` or else the key
        when the worker has a fencing key), plus ``Fencing-Resource`` when ``resource`` is given (omitted: the
        downstream's default, the idempotency key itself: one fence per action)."""
        headers = downstream_headers(self.idempotency_key, self.fencing_token, resource)
        if self.settings.fencing_key is not None:
            headers[FENCING_TOKEN_HEADER] = self.signed_fencing_token(resource or self.idempotency_key)
        return headers

    def receipt(self, external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
        """A settlement receipt of what the tool just read back, verified now: ``external_system`` what was
        written (``"sql:inventory"``), ``external_id`` the target's own id of the outcome, ``status`` what the
        readback observed (``"present"``), ``details`` small JSON-able facts (sizes, digests)."""
        return SettlementReceipt.now(external_system, external_id, status, **details)

    async def advance(self, stage: Stage, reason: str) -> None:
        """Enter ``stage`` (it may repeat the current one, never go back) with a specific ``reason`` ("publishing
        draft 42"): record it in the ledger (a guarded renewal), then heartbeat it. The ledger's stage never goes
        below the furthest stage an earlier attempt reached, so a read-back cannot erase ``commit`` (G6).

        Raises:
            LeaseLostError: the lease lapsed or was superseded; stop and start no new side effect.
            LedgerUnavailableError: the ledger could not be reached: the stage is not recorded and
                the lease not confirmed; do not start the stage's work.
            ValueError: ``stage`` goes back, or is ``settled`` (settling is the runtime's job).
        """
        if stage is Stage.SETTLED:
            raise ValueError("a tool does not enter 'settled'; return a ToolResult with its receipt")
        if self.stage is not None and stage.order < self.stage.order:
            raise ValueError(f"stage cannot go back from {self.stage.value} to {stage.value}")
        await self._renew(reason, stage)
        if stage is Stage.COMMIT and self.committed_at is None:
            self.committed_at = time.perf_counter()
        self.stage = stage

    async def renew(self, reason: str) -> None:
        """Extend the lease in the current stage with a specific reason ("18 of 24 documents"); raises as
        :meth:`advance` does (``LeaseLostError``, ``LedgerUnavailableError``: the lease is not confirmed)."""
        await self._renew(reason, None)

    def _timeout_changed(self) -> tuple[str, dict[str, Any]]:
        """A changed heartbeat timeout read since the last renewal: the reason's suffix and the renewal's details."""
        check, self._timeout_check = self._timeout_check, None
        if check is None or not check.done() or check.cancelled() or check.exception() is not None:
            self._timeout_check = check if check is not None and not check.done() else None
            return "", {}
        found = check.result()
        if found is None or found == self.heartbeat_timeout:
            return "", {}
        self.heartbeat_timeout = found
        ttl = self.claim.lease_ttl
        facts = {"heartbeat_timeout_ms": round(found / _MS), "lease_ttl_ms": round(ttl / _MS)}
        if found == ttl:
            return f" [Temporal's heartbeat timeout is back to the lease TTL ({ttl.total_seconds():g}s)]", facts
        self._ledger.metrics.heartbeat_timeout_changed(self.claim.tool, shorter=found < ttl)
        follows = (
            f"the lease follows it ({found.total_seconds():g}s)"
            if found < ttl
            else f"the lease keeps its TTL ({ttl.total_seconds():g}s)"
        )
        note = (
            f" [Temporal's heartbeat timeout is now {found.total_seconds():g}s, not the lease TTL "
            f"{ttl.total_seconds():g}s (temporal activity update-options): {follows}]"
        )
        logger.warning("%s:%s", self.claim.task_id, note)
        return note, facts

    async def _read_timeout(self) -> None:
        """Read Temporal's heartbeat timeout when a read is due; one still under way answers the next renewal."""
        now = time.monotonic()
        if self._timeout_check is not None or now < self._next_timeout_check or not activity.in_activity():
            return
        self._next_timeout_check = now + HEARTBEAT_CHECK_INTERVAL.total_seconds()
        info = activity.info()

        async def read() -> timedelta | None:
            found = heartbeat_timeout_of(await pending_activity(info))
            return None if found is None else followed_timeout(found, info.heartbeat_timeout, self.claim.lease_ttl)

        self._timeout_check = asyncio.ensure_future(read())
        wait = min(DESCRIBE_WAIT, min(self.heartbeat_timeout, self.claim.lease_ttl) / 10)
        await asyncio.wait({self._timeout_check}, timeout=wait.total_seconds())

    async def _renew(self, reason: str, stage: Stage | None) -> None:
        if self._lost is not None:
            raise self._lost
        reason = redact(reason)  # it also leaves in heartbeat details and the run's progress (docs/security.md)
        await self._read_timeout()
        asked = time.monotonic()
        note, changed = self._timeout_changed()
        ttl = min(self.heartbeat_timeout, self.claim.lease_ttl)  # the lease follows the shorter
        try:
            expires_at = await self._ledger.renew(
                self.claim, reason=reason + note, stage=stage, details=changed or None, ttl=ttl
            )
        except LeaseLostError as exc:
            self._lost = exc
            raise
        except LedgerUnavailableError as exc:
            if self._unavailable is None:
                logger.warning(
                    "ledger unavailable: renewal of %s (generation %d, %s) not confirmed, the tool starts no new "
                    "side effect: %s",
                    self.claim.task_id,
                    self.claim.generation,
                    str(stage or self.stage or "no stage"),
                    exc,
                )
            self._unavailable = exc
            raise
        self._unavailable = None
        self.confirmed_until = asked + ttl.total_seconds()
        if stage is not None and stage is not self.stage:
            self._tell_run(stage, reason)
        elif self._progress_sent_at is not None and time.monotonic() - self._progress_sent_at >= PROGRESS_INTERVAL:
            self._tell_run(self.stage, reason)
        await self._heartbeat(
            LeaseHeartbeat(
                task_id=self.claim.task_id,
                claim_generation=self.claim.generation,
                stage=stage or self.stage,
                reason=reason,
                lease_expires_at=expires_at,
            )
        )

    async def _heartbeat(self, details: LeaseHeartbeat) -> None:
        """Heartbeat to Temporal; under a heartbeat timeout shorter than the scheduled one, straight to it too."""
        if not activity.in_activity():  # unit tests of tools: nothing to heartbeat to
            return
        self.heartbeat_details = details.model_dump(mode="json")
        activity.heartbeat(self.heartbeat_details)
        info = activity.info()
        if info.heartbeat_timeout is None or self.heartbeat_timeout >= info.heartbeat_timeout:
            return
        try:
            handle = activity.client().get_async_activity_handle(task_token=info.task_token)
            limit = self.heartbeat_timeout.total_seconds() / 2
            await asyncio.wait_for(handle.heartbeat(details.model_dump(mode="json")), limit)
        except Exception as exc:  # noqa: BLE001 - Temporal's own heartbeat still goes; it tells a lost attempt
            logger.debug("direct heartbeat of %s not recorded: %s", self.claim.task_id, exc)

    def _tell_run(self, stage: Stage | None, reason: str) -> None:
        """Signal the attempt's own run what the ledger just recorded (best effort, built only when sent)."""
        self._progress_next = (stage, reason)
        if (self._progress_sender is None or self._progress_sender.done()) and activity.in_activity():
            self._progress_sender = asyncio.ensure_future(self._send_progress())

    async def _send_progress(self) -> None:
        """Send the latest progress, then what came meanwhile, at most one per :data:`PROGRESS_MIN_GAP`."""
        while self._progress_next is not None:
            due = (
                self._progress_first_at if self._progress_sent_at is None else self._progress_sent_at + PROGRESS_MIN_GAP
            )
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            pending, self._progress_next = self._progress_next, None
            if pending is None:
                return
            progress = _progress(self.claim, self._progress_key, stage=pending[0], reason=pending[1])
            if progress is None:  # the task is not a step of the run that scheduled it
                return
            info = activity.info()
            try:
                handle = activity.client().get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
            except RuntimeError:  # an activity environment without a client (unit tests of tools)
                return
            self._progress_sent_at = time.monotonic()
            try:
                await handle.signal(LEASE_PROGRESS_SIGNAL, progress.model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - the ledger holds the record; the run's view just lags
                logger.debug("progress of %s not signalled to its run: %s", progress.step_id, exc)
                return

    def end_progress(self) -> None:
        """The attempt ended: drop the progress not sent yet and any read of the heartbeat timeout under way."""
        self._progress_next = None
        if self._progress_sender is not None and not self._progress_sender.done():
            self._progress_sender.cancel()
        if self._timeout_check is not None and not self._timeout_check.done():
            self._timeout_check.cancel()


_MS = timedelta(milliseconds=1)

REPORT_TIMEOUT = timedelta(seconds=5)
"""How long a losing attempt tries to tell its run of a refused write before it gives up (best effort)."""


def _progress(
    claim: Claim, key: str | None, *, stage: Stage | None, reason: str, refused_writes: int | None = None
) -> LeaseProgress | None:
    """The progress of ``claim`` for the run that scheduled it, proven with ``key``; ``None`` outside one."""
    if not activity.in_activity():
        return None
    info = activity.info()
    step_id = claim.task_id.removeprefix(f"{info.workflow_id}/")
    if not info.workflow_id or step_id == claim.task_id:
        return None  # not a step of the run that scheduled it
    progress = LeaseProgress(
        step_id=step_id,
        claim_generation=claim.generation,
        lease_owner=claim.owner[:255],
        stage=stage,
        reason=reason[:_MAX_REASON_CHARS],
        refused_writes=refused_writes,
    )
    return progress if key is None else prove(key, progress)


async def report_refused_writes(claim: Claim, key: str | None, count: int) -> None:
    """Tell the attempt's run the task's count of refused late writes (best effort, one proven signal)."""
    if key is None:
        return
    progress = _progress(claim, key, stage=None, reason="a late write was refused", refused_writes=count)
    if progress is None:
        return
    info = activity.info()
    try:
        handle = activity.client().get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
        await asyncio.wait_for(
            handle.signal(LEASE_PROGRESS_SIGNAL, progress.model_dump(mode="json")), REPORT_TIMEOUT.total_seconds()
        )
    except Exception as exc:  # noqa: BLE001 - the ledger holds the record; the run's count just lags
        logger.debug("refused writes of %s not signalled to its run: %s", claim.task_id, exc)
