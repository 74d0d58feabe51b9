"""The lease context a tool runs in: an attempt that has already claimed its task.

``advance(stage, reason)`` writes the stage to the ledger first, then heartbeats the same details to
Temporal (G5): heartbeat details are throttled by the SDK and the server keeps only the latest, so
they are a copy for the Temporal UI and the next attempt, never the record.

After the ledger recorded a claim or a stage, the attempt also tells its own run (the
``agentlease.lease_progress`` signal, :class:`~agentlease.records.LeaseProgress`): the run's ``status``
query, search attributes and current details then show the live stage, generation and owner
(``docs/operator-views.md``). Nothing is sent before the attempt has run for
:data:`PROGRESS_FIRST_AFTER` (a quick call sends none: its result tells the run), then the latest
progress, and later stage changes at most one per :data:`PROGRESS_MIN_GAP` (the latest one wins);
renewals in the same stage at most once per :data:`PROGRESS_INTERVAL`. What is still unsent when the
attempt ends is dropped. The signal is best effort and never holds the tool up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError, LedgerUnavailableError
from agentlease.fencing import sign_fencing_token
from agentlease.idempotency.convention import FENCING_TOKEN_HEADER, downstream_headers
from agentlease.ledger.store import Ledger
from agentlease.names import LEASE_PROGRESS_SIGNAL
from agentlease.records import Claim, LeaseProgress, SettlementReceipt, StoredReceipt
from agentlease.recovery._policy import RecoveryDecision
from agentlease.secrets import EnvSecretProvider, ToolSecrets, ToolSettings
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
        side_effect_class: the tool's class.
        previous_receipt: a receipt already stored for this idempotency key, if any.
        settings: the settings this tool may read (:class:`~agentlease.secrets.ToolSettings`:
            those it declared, or every one but the worker's own; never the ledger URL).
        secrets: this tool's own secrets (:class:`~agentlease.secrets.ToolSecrets`):
            ``ctx.secrets.get("api_token")``.
        resources: what the worker's tools share (database engines by URL).
        recovery: the recovery decision for this attempt; ``recovery.read_back_first`` is true when
            an earlier attempt reached ``commit`` and the tool must read back before it writes.
        stage: the last stage this attempt recorded (``None`` before the first ``advance``).
        committed_at: when this attempt entered ``commit`` (``time.perf_counter()`` seconds),
            for the settlement latency metric; ``None`` if it did not.
        confirmed_until: until when (``time.monotonic()`` seconds) the last confirmed renewal (or
            the claim) keeps the lease, by this worker's estimate; the ledger's clock decides.
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
    ) -> None:
        self._ledger = ledger
        self.claim = claim
        self.side_effect_class = side_effect_class
        self.previous_receipt = previous_receipt
        self.settings = settings if isinstance(settings, ToolSettings) else ToolSettings(settings, claim.tool)
        self.secrets = secrets or ToolSecrets(EnvSecretProvider(), claim.tool)
        self.resources = resources or ToolResources()
        self.recovery = recovery
        self.stage: Stage | None = None
        self.committed_at: float | None = None
        self.confirmed_until = time.monotonic() + claim.lease_ttl.total_seconds()
        self._lost: LeaseLostError | None = None
        self._unavailable: LedgerUnavailableError | None = None
        self._progress_sent_at: float | None = None
        self._progress_first_at = time.monotonic() + PROGRESS_FIRST_AFTER
        self._progress_next: LeaseProgress | None = None
        self._progress_sender: asyncio.Task[None] | None = None
        self._tell_run(None, "claimed")

    @property
    def fencing_token(self) -> int:
        """The claim generation, to send to fenced downstream systems (``Fencing-Token``)."""
        return self.claim.generation

    def signed_fencing_token(self, resource: str) -> str:
        """The fencing token for ``resource`` as a downstream with the fencing key verifies it:
        ``<generation>.<signature>`` (``docs/security.md``, "Fencing tokens a downstream can verify").

        Raises:
            ValueError: the worker has no fencing key (``AGENTLEASE_FENCING_KEY``), or a bad resource.
        """
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
        """True while the ledger cannot be reached (the last renewal failed with
        :class:`LedgerUnavailableError`): the lease is not confirmed, start no new side effect. A later
        renewal that succeeds confirms the lease again and clears it."""
        return self._unavailable is not None

    def downstream_headers(self, resource: str | None = None) -> dict[str, str]:
        """The headers of a write to a downstream that follows the project's HTTP convention.

        Args:
            resource: the fenced resource (``Fencing-Resource``); omitted: the service names it
                (by default, the request path).

        Returns:
            ``Idempotency-Key`` (the task's key) and ``Fencing-Token`` (the claim generation; signed
            for ``resource`` when the worker has a fencing key and ``resource`` is given), plus
            ``Fencing-Resource`` when ``resource`` is given.
        """
        headers = downstream_headers(self.idempotency_key, self.fencing_token, resource)
        if resource is not None and self.settings.fencing_key is not None:
            headers[FENCING_TOKEN_HEADER] = self.signed_fencing_token(resource)
        return headers

    def receipt(self, external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
        """A settlement receipt of what the tool just read back, verified now.

        Args:
            external_system: what was written (``"tracker"``, ``"sql:inventory"``...).
            external_id: the target's own id of the outcome.
            status: what the readback observed (``"open"``, ``"present"``...).
            **details: small JSON-able facts from the readback (sizes, digests).
        """
        return SettlementReceipt(
            external_system=external_system,
            external_id=external_id,
            status=status,
            details=details,
            verified_at=datetime.now(UTC),
        )

    async def advance(self, stage: Stage, reason: str) -> None:
        """Enter ``stage``: record it in the ledger (a guarded renewal), then heartbeat it.

        The ledger's stage never goes below the furthest stage an earlier attempt reached, so a
        read-back attempt that starts again at ``preflight`` cannot erase ``commit`` (G6).

        Args:
            stage: the next stage; it may repeat the current one but never go back.
            reason: what the tool is about to do, specifically ("publishing draft 42").

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
        """Extend the lease in the current stage with a specific reason ("18 of 24 documents").

        Raises:
            LeaseLostError: the lease lapsed or was superseded.
            LedgerUnavailableError: the ledger could not be reached; the lease is not confirmed.
        """
        await self._renew(reason, None)

    async def _renew(self, reason: str, stage: Stage | None) -> None:
        if self._lost is not None:
            raise self._lost
        asked = time.monotonic()
        try:
            expires_at = await self._ledger.renew(self.claim, reason=reason, stage=stage)
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
        self.confirmed_until = asked + self.claim.lease_ttl.total_seconds()
        if stage is not None and stage is not self.stage:
            self._tell_run(stage, reason)
        elif self._progress_sent_at is not None and time.monotonic() - self._progress_sent_at >= PROGRESS_INTERVAL:
            self._tell_run(self.stage, reason)
        _heartbeat(
            LeaseHeartbeat(
                task_id=self.claim.task_id,
                claim_generation=self.claim.generation,
                stage=stage or self.stage,
                reason=reason,
                lease_expires_at=expires_at,
            )
        )

    def _tell_run(self, stage: Stage | None, reason: str) -> None:
        """Signal the attempt's own run what the ledger just recorded (best effort, in the background)."""
        if not activity.in_activity():
            return
        info = activity.info()
        step_id = self.claim.task_id.removeprefix(f"{info.workflow_id}/")
        if not info.workflow_id or step_id == self.claim.task_id:
            return  # not a step of the run that scheduled it
        self._progress_next = LeaseProgress(
            step_id=step_id,
            claim_generation=self.claim.generation,
            lease_owner=self.claim.owner[:255],
            stage=stage,
            reason=reason[:_MAX_REASON_CHARS],
        )
        if self._progress_sender is None or self._progress_sender.done():
            try:
                client = activity.client()
            except RuntimeError:  # an activity environment without a client (unit tests of tools)
                return
            handle = client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
            self._progress_sender = asyncio.ensure_future(self._send_progress(handle))

    async def _send_progress(self, handle: Any) -> None:
        """Send the latest progress, then what came meanwhile, at most one per :data:`PROGRESS_MIN_GAP`."""
        while self._progress_next is not None:
            due = (
                self._progress_first_at if self._progress_sent_at is None else self._progress_sent_at + PROGRESS_MIN_GAP
            )
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            progress, self._progress_next = self._progress_next, None
            if progress is None:
                return
            self._progress_sent_at = time.monotonic()
            try:
                await handle.signal(LEASE_PROGRESS_SIGNAL, progress.model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - the ledger holds the record; the run's view just lags
                logger.debug("progress of %s not signalled to its run: %s", progress.step_id, exc)
                return

    def end_progress(self) -> None:
        """The attempt ended: drop the progress not sent yet (the activity's result tells the run)."""
        self._progress_next = None
        if self._progress_sender is not None and not self._progress_sender.done():
            self._progress_sender.cancel()


def _heartbeat(details: LeaseHeartbeat) -> None:
    # Outside an activity (unit tests of tools) there is nothing to heartbeat to.
    if activity.in_activity():
        activity.heartbeat(details.model_dump(mode="json"))


__all__ = ["LeaseContext", "LeaseHeartbeat"]
