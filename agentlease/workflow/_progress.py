"""The run's side of lease progress: which ``agentlease.lease_progress`` signals it believes, and the late
writes the ledger refused on its tasks (``docs/operator-views.md``, ``docs/security.md``).

Deterministic workflow code, used by :class:`~agentlease.workflow._calls.LeasedToolCalls`:

- a progress signal is shown only when its proof verifies with the key of the step it names
  (:mod:`agentlease.progress`); any other (no proof, a made-up one, a step the run does not have, a
  malformed payload) is dropped and counted, nothing else: no trail entry, no activity, no state that
  grows with the signals;
- each task's count of refused late writes, learnt from
  the losing attempt's report (a proven progress signal with ``refused_writes``) or from the outcome of
  a later generation (read from the ledger), is kept on its view, and their sum is the search attribute
  ``AgentLeaseRefusedWrites``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from agentlease.progress import PROGRESS_SECRET, proven, step_key
    from agentlease.records import LeaseProgress, TaskView

_SECRET_TIMEOUT = timedelta(seconds=10)


class ProgressProofs:
    """The run's progress secret (minted once, by a local activity, when its first call is scheduled),
    and the count of progress signals it dropped."""

    def __init__(self) -> None:
        self.refused = 0
        """Progress signals dropped for want of a valid proof."""
        self._secret: str | None = None
        self._minting = asyncio.Lock()

    async def call_key(self, step_id: str) -> str:
        """The progress key of ``step_id``'s calls."""
        async with self._minting:  # calls scheduled in parallel mint one secret
            if self._secret is None:
                minted = await workflow.execute_local_activity(
                    PROGRESS_SECRET, start_to_close_timeout=_SECRET_TIMEOUT, result_type=str
                )
                self._secret = self._secret or minted  # one learnt meanwhile (:meth:`learn`) stays
        return step_key(self._secret, step_id)

    @property
    def wanted(self) -> bool:
        """The run proves progress and has no secret yet (:meth:`learn` one)."""
        return self._secret is None

    def learn(self, secret: str) -> None:
        """Take ``secret``, minted with the run's catalog (``agentlease.describe_run``), unless the run already
        has one: a secret, once a call's key came from it, never changes."""
        if self.wanted:
            self._secret = secret

    def accepted(self, payload: Any, steps: Mapping[str, TaskView]) -> LeaseProgress | None:
        """The signal's :class:`LeaseProgress` when the run believes it; ``None`` when it is dropped
        (counted in :attr:`refused`)."""
        try:
            progress = LeaseProgress.model_validate(payload)
        except ValidationError:
            self._refuse()
            return None
        if self._secret is None or progress.step_id not in steps:
            self._refuse()
            return None
        if not proven(step_key(self._secret, progress.step_id), progress):
            self._refuse()
            return None
        return progress

    def _refuse(self) -> None:
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood logs a few lines
            workflow.logger.warning(
                "dropped a lease progress signal without a valid proof (%d so far): not from an attempt of this run",
                self.refused,
            )

    def line(self) -> str | None:
        """The current details' line about dropped signals, if any."""
        if not self.refused:
            return None
        return f"{self.refused} lease progress signal{'s' if self.refused != 1 else ''} refused (no proof of the lease)"


def refused_writes_line(views: Mapping[str, TaskView]) -> list[str]:
    """The current details' lines about refused late writes, one per task that had any."""
    return [
        f"{view.step_id}: {view.refused_writes} late write{'s' if view.refused_writes != 1 else ''} refused"
        for view in views.values()
        if view.refused_writes
    ]


__all__ = ["ProgressProofs", "refused_writes_line"]
