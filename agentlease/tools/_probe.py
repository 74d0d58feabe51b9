"""Readback probes: a tool's own answer to "did the action with this key happen?", asked under the lease before an
ambiguous task waits for a person or a retry runs (``docs/action-keys-and-probes.md``, "Probes").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from agentlease.enums import ProbeAnswer, Stage
from agentlease.records import LeaseEvent, SettlementReceipt
from agentlease.security.secrets import ToolSettings

__all__ = ["Probe", "ProbeQuery", "ProbeResult"]


@dataclass(frozen=True)
class ProbeQuery:
    """What a probe is asked: whether the action of ``idempotency_key`` happened at the downstream.

    Attributes:
        arguments: the call's validated arguments (an instance of the tool's argument model).
        previous_stage: the furthest stage an earlier attempt recorded (``external_call`` or later).
        previous_error_class: how the previous attempt ended, if it did (``None``: its lease lapsed).
        real_attempts: attempts that ran the tool before this one.
        fencing_token: the claim generation of the attempt that probes.
        earlier: the task's evidence trail so far, oldest first.
        settings: the settings the tool may read (the downstream's address...).
    """

    tool: str
    task_id: str
    idempotency_key: str
    arguments: BaseModel
    previous_stage: Stage | None
    previous_error_class: str | None
    real_attempts: int
    fencing_token: int
    earlier: list[LeaseEvent] = field(default_factory=list)
    settings: ToolSettings | None = None

    def receipt(self, external_system: str, external_id: str, status: str, **details: Any) -> SettlementReceipt:
        """A settlement receipt of what the probe just read back, verified now."""
        return SettlementReceipt.now(external_system, external_id, status, **details)


@dataclass(frozen=True)
class ProbeResult:
    """A probe's answer. Make it with :meth:`happened` (confirmed), :meth:`not_happened` (not applied),
    :meth:`cannot_tell` (inconclusive) or :meth:`conflict`; ``evidence``: small JSON-able facts the probe saw, kept
    in the evidence trail."""

    answer: ProbeAnswer
    receipt: SettlementReceipt | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.answer is ProbeAnswer.HAPPENED) != (self.receipt is not None):
            raise ValueError("a probe answers 'happened' with a receipt, and only then")

    @classmethod
    def happened(cls, receipt: SettlementReceipt, **evidence: Any) -> ProbeResult:
        """The downstream shows the action: settle from ``receipt`` (build it from the readback)."""
        return cls(ProbeAnswer.HAPPENED, receipt, evidence)

    @classmethod
    def not_happened(cls, **evidence: Any) -> ProbeResult:
        """The downstream shows the action did not happen, and no earlier attempt can still make it happen."""
        return cls(ProbeAnswer.NOT_HAPPENED, None, evidence)

    @classmethod
    def cannot_tell(cls, why: str, **evidence: Any) -> ProbeResult:
        """The downstream cannot say: a person decides, as without a probe."""
        return cls(ProbeAnswer.CANNOT_TELL, None, {"why": why, **evidence})

    @classmethod
    def conflict(cls, why: str, **evidence: Any) -> ProbeResult:
        """The downstream holds this key for an action with other arguments: the tool never runs again for it, and
        a person decides with ``why`` and ``evidence`` (what the downstream holds under the key)."""
        return cls(ProbeAnswer.CONFLICT, None, {"why": why, **evidence})

    def summary(self) -> str:
        """One line for the trail: the answer and what the probe saw."""
        if self.answer is ProbeAnswer.HAPPENED:
            assert self.receipt is not None
            what = f"receipt {self.receipt.external_system}:{self.receipt.external_id} ({self.receipt.status})"
        else:
            what = str(self.evidence.get("why") or "") or ", ".join(f"{k}={v}" for k, v in self.evidence.items())
        return f"{self.answer.value}" + (f": {what}" if what else "")


Probe = Callable[[ProbeQuery], Awaitable[ProbeResult]]
"""A tool's readback probe: ``async def probe(query: ProbeQuery) -> ProbeResult``."""
