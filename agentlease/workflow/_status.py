"""The run as its operators see it: its state, each task's view, the search attributes and current details,
the ``status`` query, and the proven ``agentlease.lease_progress`` signal (``docs/operator-views.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Mapping
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from agentlease.enums import RunState, Stage, TaskStatus
    from agentlease.observability import search_attributes as sa
    from agentlease.records import LeaseProgress, RefusedDecision, RunStatus, TaskView, ToolOutcome
    from agentlease.security.progress import PROGRESS_SECRET, proven, step_key
    from agentlease.security.redaction import redact

_SECRET_TIMEOUT = timedelta(seconds=10)


class ProgressProofs:
    """The run's progress secret (minted once, by a local activity), and the count of signals it dropped."""

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
        """Take ``secret``, minted with the run's catalog, unless the run already has one (it never changes)."""
        if self.wanted:
            self._secret = secret

    def accepted(self, payload: Any, steps: Mapping[str, TaskView]) -> LeaseProgress | None:
        """The signal's :class:`LeaseProgress` when the run believes it; ``None`` (counted) when dropped."""
        try:
            progress = LeaseProgress.model_validate(payload)
        except ValidationError:
            progress = None
        secret = self._secret
        if progress is None or secret is None or progress.step_id not in steps:
            self._refuse()
            return None
        if not proven(step_key(secret, progress.step_id), progress):
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


KEPT_REFUSALS = 20
"""How many refused ``decide`` signals the ``status`` query keeps (the evidence trail keeps a summary)."""


class RunView:
    """The run's state and task views, and how they are shown."""

    def __init__(self, run_id: str, running: Container[str]) -> None:
        self.run_id = run_id
        self.state = RunState.STARTING  # set with set_state
        self.closed = False
        """The run takes no more calls (shown by the ``status`` query)."""
        self.tasks: dict[str, TaskView] = {}
        """Each step's view, by step id, in the order the steps were added."""
        self.last_decision: str | None = None
        self.refused: list[RefusedDecision] = []
        """The last :data:`KEPT_REFUSALS` refused ``decide`` signals (:meth:`refused_signal`)."""
        self.refused_count = 0
        self.proofs = ProgressProofs()
        self._running = running
        self._shown: dict[str, Any] = {}
        self._wanted: dict[str, Any] = {}
        self._highest_generation = 0  # AgentLeaseGeneration

    def update(self, step_id: str, **changes: Any) -> TaskView:
        """Change a step's view; returns the new view."""
        view = self.tasks[step_id].model_copy(update=changes)
        self.tasks[step_id] = view
        return view

    def set_state(
        self, state: RunState, *, waiting_reason: str | None = None, tool: str | None = None, stage: Any = ...
    ) -> None:
        """Set the run's state; its search attributes follow (see :meth:`show`), at once when the run ends."""
        self.state = state
        self._wanted[sa.RUN_STATUS.name] = state.value
        if waiting_reason is not None:
            self._wanted[sa.WAITING_REASON.name] = waiting_reason
        if tool is not None:
            self._wanted[sa.CURRENT_TOOL.name] = tool
        if stage is not ...:
            self._wanted[sa.CURRENT_STAGE.name] = str(getattr(stage, "value", stage) or "")
        if state.ended:
            self.show()

    def end(self, state: RunState) -> None:
        """The run ended (completed, cancelled or failed): no more calls or decisions."""
        self.closed = True
        self.set_state(state, waiting_reason="")

    def refresh_waiting(self) -> None:
        """``waiting`` while any step waits for a person, with who waits for what; else ``running``."""
        if self.state.ended:
            return
        waiting = [f"{v.step_id}: {v.status.value}" for v in self.tasks.values() if v.status.awaits_decision]
        self.set_state(RunState.WAITING if waiting else RunState.RUNNING, waiting_reason=", ".join(waiting))

    def step_started(self, tool: str) -> None:
        """A step of ``tool`` starts: no stage yet, and the previous step's owner is not this one's."""
        self.set_state(self.state, tool=tool, stage=None)
        self._wanted[sa.CURRENT_OWNER.name] = ""

    def attempt_ended(self, step_id: str, outcome: ToolOutcome) -> TaskView:
        """Show how a step's attempt ended, with the owner and claim time of the generation that ended it."""
        self.set_state(self.state, stage=outcome.stage)
        self._highest_generation = max(self._highest_generation, outcome.claim_generation)
        self._wanted[sa.CURRENT_GENERATION.name] = self._highest_generation
        self._wanted[sa.CURRENT_OWNER.name] = outcome.lease_owner or ""
        if outcome.refused_writes is not None:
            self.learn_refused_writes(step_id, outcome.refused_writes)
        return self.update(
            step_id,
            status=outcome.status,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation,
            attempts=outcome.attempts,
            receipt=outcome.receipt,
            error=None,
            settled_by=outcome.settled_by,
            lease_owner=outcome.lease_owner,
            claimed_at=outcome.claimed_at,
        )

    def learn_refused_writes(self, step_id: str, count: int) -> None:
        """The task's refused late writes are at least ``count`` (reports arrive in any order)."""
        if count <= self.tasks[step_id].refused_writes:
            return
        self.update(step_id, refused_writes=count)
        self._wanted[sa.REFUSED_WRITES.name] = sum(view.refused_writes for view in self.tasks.values())

    def decided(self, text: str) -> None:
        """The run's last decision (``publish: approved``), shown in ``AgentLeaseDecision``."""
        self.last_decision = text
        self._wanted[sa.LAST_DECISION.name] = text

    def refused_signal(self, refused: RefusedDecision) -> None:
        """Keep a refused ``decide`` signal for ``status``, and count it."""
        self.refused = [*self.refused, refused][-KEPT_REFUSALS:]
        self.refused_count += 1

    def show(self) -> None:
        """Upsert the search attributes that changed since they were last shown, in one command, and the details."""
        changed = {name: value for name, value in self._wanted.items() if self._shown.get(name) != value}
        if changed:
            self._shown.update(changed)
            workflow.upsert_search_attributes([sa.BY_NAME[name].value_set(value) for name, value in changed.items()])
        self.show_details()

    def show_details(self) -> None:
        """Set the run's current details (:meth:`current_details`)."""
        workflow.set_current_details(self.current_details())

    def status(self) -> RunStatus:
        """The run as the ``status`` query reports it."""
        return RunStatus(
            agent_run_id=self.run_id,
            status=self.state,
            closed=self.closed,
            tasks=list(self.tasks.values()),
            last_decision=self.last_decision,
            refused=list(self.refused),
            refused_count=self.refused_count,
            refused_progress=self.proofs.refused,
        )

    def status_query(self) -> dict[str, Any]:
        """The ``status`` query's handler: :meth:`status` as JSON."""
        return self.status().model_dump(mode="json")

    def current_details(self) -> str:
        """The run's current details: a line per running or waiting step, the last decision and refusal."""
        lines = []
        for view in self.tasks.values():
            if view.status is TaskStatus.RUNNING:
                line = f"{view.step_id}: {view.stage.value if view.stage else 'claiming'}"
                if view.claim_generation:
                    line += f", generation {view.claim_generation}"
                if view.progress and view.stage is not None:
                    line += f", renewing: {view.progress}"
                if view.lease_owner:
                    line += f" ({view.lease_owner})"
                lines.append(line)
            elif view.status.awaits_decision:
                line = f"{view.step_id}: {view.status.value}, waiting for a person"
                if view.status is TaskStatus.AWAITING_APPROVAL and view.approval_request is not None:
                    line += f" to approve {view.approval_request.describe()}"
                lines.append(line)
        if not lines:
            lines.append(f"run {self.state.value}")
        lines += [  # a call another generation took over: who settled it
            f"{view.step_id}: settled by generation {view.claim_generation} ({view.lease_owner})"
            for view in self.tasks.values()
            if view.status is TaskStatus.SETTLED and (view.claim_generation or 0) > 1 and view.lease_owner
        ]
        if self.last_decision:
            lines.append(f"last decision: {self.last_decision}")
        if self.refused:
            last = self.refused[-1]
            lines.append(f"refused {last.decision} signal by {last.by or '?'}: {last.refusal}")
        lines += refused_writes_line(self.tasks)
        if (dropped := self.proofs.line()) is not None:
            lines.append(dropped)
        return "\n".join(lines)

    async def on_progress(self, payload: Any) -> None:
        """Show a running attempt's progress (a late or stale one is ignored; ``docs/operator-views.md``)."""
        progress = self.proofs.accepted(payload, self.tasks)
        if progress is None:  # malformed or not proven: dropped, counted
            self.show_details()
            return
        sid = progress.step_id
        if progress.refused_writes is not None:  # an attempt that lost its lease, not live progress
            if sid in self.tasks:
                self.learn_refused_writes(sid, progress.refused_writes)
                self.show_details()
                await workflow.wait_condition(lambda: True)  # after every signal of this workflow task
                self.show()
            return
        if sid not in self._running:
            return  # the attempt already ended: its outcome is the newer fact
        view = self.tasks[sid]
        known = (view.claim_generation or 0, _stage_order(view.stage))
        if (progress.claim_generation, _stage_order(progress.stage)) < known:  # older, or arrived out of order
            return
        self.update(
            sid,
            stage=progress.stage,
            claim_generation=progress.claim_generation,
            lease_owner=progress.lease_owner,
            progress=redact(progress.reason),
        )
        self._highest_generation = max(self._highest_generation, progress.claim_generation)
        self._wanted[sa.CURRENT_GENERATION.name] = self._highest_generation
        self._wanted[sa.CURRENT_OWNER.name] = progress.lease_owner
        self._wanted[sa.CURRENT_STAGE.name] = progress.stage.value if progress.stage else ""
        self.show_details()
        await workflow.wait_condition(lambda: True)  # after every signal of this workflow task
        self.show()


def _stage_order(stage: Stage | None) -> int:
    return -1 if stage is None else stage.order


__all__ = ["KEPT_REFUSALS", "RunView"]
