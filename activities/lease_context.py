"""The lease context a tool runs in: an attempt that has already claimed its task.

``advance(stage, reason)`` writes the stage to the ledger first, then heartbeats the same details to
Temporal (G5): heartbeat details are throttled by the SDK and the server keeps only the latest, so
they are a copy for the Temporal UI and the next attempt, never the record.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, StoredReceipt
from agentlease.settings import AgentLeaseSettings
from reconciliation.policy import RecoveryAction, RecoveryDecision


class LeaseHeartbeat(BaseModel):
    """Heartbeat details: the same facts the ledger recorded, for the Temporal UI."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    claim_generation: int
    stage: Stage | None
    reason: str
    lease_expires_at: datetime


class LeaseContext:
    """What a tool sees of its lease.

    Attributes:
        claim: the lease this attempt holds.
        side_effect_class: the tool's class.
        previous_receipt: a receipt already stored for this idempotency key, if any.
        settings: the worker's settings (endpoints of the built-in tools).
        recovery: the recovery decision for this attempt (``read_back_first`` after ``commit``...).
        stage: the last stage this attempt recorded (``None`` before the first ``advance``).
        committed_at: when this attempt entered ``commit`` (``time.perf_counter()`` seconds),
            for the settlement latency metric; ``None`` if it did not.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        claim: Claim,
        side_effect_class: SideEffectClass,
        previous_receipt: StoredReceipt | None,
        settings: AgentLeaseSettings,
        recovery: RecoveryDecision,
    ) -> None:
        self._ledger = ledger
        self.claim = claim
        self.side_effect_class = side_effect_class
        self.previous_receipt = previous_receipt
        self.settings = settings
        self.recovery = recovery
        self.stage: Stage | None = None
        self.committed_at: float | None = None
        self._lost: LeaseLostError | None = None

    @property
    def fencing_token(self) -> int:
        """The claim generation, to send to fenced downstream systems."""
        return self.claim.generation

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
        """The previous attempt's last durable stage, as the ledger recorded it."""
        return self.claim.previous_stage

    @property
    def lease_lost(self) -> bool:
        """True once a renewal was refused; the tool must start no new side effect."""
        return self._lost is not None

    async def advance(self, stage: Stage, reason: str) -> None:
        """Enter ``stage``: record it in the ledger (a guarded renewal), then heartbeat it.

        The ledger's stage never goes below the furthest stage an earlier attempt reached, so a
        read-back attempt that starts again at ``preflight`` cannot erase ``commit`` (G6).

        Args:
            stage: the next stage; it may repeat the current one but never go back.
            reason: what the tool is about to do, specifically ("publishing draft 42").

        Raises:
            LeaseLostError: the lease lapsed or was superseded; stop and start no new side effect.
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
        """
        await self._renew(reason, None)

    async def _renew(self, reason: str, stage: Stage | None) -> None:
        if self._lost is not None:
            raise self._lost
        recorded = stage
        if stage is not None and self.claim.previous_stage is not None and self.claim.previous_stage.order > stage.order:
            # The ledger keeps the furthest stage any attempt reached: a later attempt that dies in
            # preflight must still leave "read back first" for the next one (G6).
            recorded = self.claim.previous_stage
        try:
            expires_at = await self._ledger.renew(self.claim, reason=reason, stage=recorded)
        except LeaseLostError as exc:
            self._lost = exc
            raise
        _heartbeat(
            LeaseHeartbeat(
                task_id=self.claim.task_id,
                claim_generation=self.claim.generation,
                stage=stage or self.stage,
                reason=reason,
                lease_expires_at=expires_at,
            )
        )


def _heartbeat(details: Any) -> None:
    # Outside an activity (unit tests of tools) there is nothing to heartbeat to.
    if activity.in_activity():
        activity.heartbeat(details)


__all__ = ["LeaseContext", "LeaseHeartbeat", "RecoveryAction"]
