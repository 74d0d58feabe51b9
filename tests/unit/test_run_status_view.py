"""What ``agentlease status`` prints of a run's last decision and refused ``decide`` signals, and the
shape of the progress signal a leased attempt sends its run (``docs/operator-views.md``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rich.console import Console

from agentlease.cli.render import run_table
from agentlease.enums import RunState, TaskStatus
from agentlease.records import LeaseProgress, RefusedDecision, RunStatus, TaskView


def printed(status: RunStatus) -> str:
    console = Console(record=True, width=200)
    console.print(run_table(status))
    return console.export_text()


def status(**more: object) -> RunStatus:
    view = TaskView(
        task_id="r/send",
        step_id="send",
        tool="smtp_send",
        status=TaskStatus.AWAITING_APPROVAL,
        idempotency_key="r:send",
    )
    return RunStatus.model_validate(
        {"agent_run_id": "r", "status": RunState.WAITING, "closed": True, "tasks": [view], **more}
    )


def test_status_prints_the_last_decision_and_each_refused_signal() -> None:
    text = printed(
        status(
            last_decision="reserve: approved by alice: ticket OPS-12",
            refused=[
                RefusedDecision(decision="redrive", step_id="send", by="mallory", refusal="cannot redrive step 'send'")
            ],
        )
    )
    assert "last decision: reserve: approved by alice: ticket OPS-12" in text
    assert "refused redrive signal (send, by mallory): cannot redrive step 'send'" in text


def test_a_run_without_decisions_prints_no_notes() -> None:
    assert "last decision" not in printed(status()) and "refused" not in printed(status())


def test_the_progress_signal_carries_no_lease_token() -> None:
    fields = {"step_id": "send", "claim_generation": 2, "lease_owner": "w-2", "stage": "external_call", "reason": "x"}
    assert LeaseProgress.model_validate(fields).claim_generation == 2
    with pytest.raises(ValidationError):
        LeaseProgress.model_validate({**fields, "lease_token": "secret"})
    with pytest.raises(ValidationError):
        LeaseProgress.model_validate({**fields, "claim_generation": 0})


def test_status_prints_what_the_run_refused_in_counts() -> None:
    view = TaskView(
        task_id="r/write",
        step_id="write",
        tool="takeover_write",
        status=TaskStatus.SETTLED,
        idempotency_key="r:write",
        refused_writes=2,
    )
    text = printed(
        RunStatus(
            agent_run_id="r",
            status=RunState.COMPLETED,
            closed=True,
            tasks=[view],
            refused_count=130,
            refused_progress=7,
        )
    )
    assert "130 decide signals refused in all" in text
    assert "write: 2 late writes refused" in text
    assert "7 lease progress signals refused (no proof of the lease)" in text
    assert "decide signals refused in all" not in printed(status())
