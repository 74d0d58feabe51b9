"""Replay: a run recorded before plan runs recorded their unknown tools in the ledger.

``tests/histories/unknown_tool/before.json`` is a run whose step names a tool no worker serves, recorded
on the dev server by the release before the ``agentlease-unknown-tool-recorded`` patch: it failed with
``UnknownTool`` and scheduled nothing. It must replay on today's workflow unchanged (the patch is not in its
history, so the run schedules no ``agentlease.record_unknown_tools``). A run recorded today, which does, is
replayed by ``tests/acceptance/test_unknown_tool_cli.py``.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory

from tests.integration.test_replay import replayer

BEFORE = Path(__file__).resolve().parents[1] / "histories" / "unknown_tool" / "before.json"


async def test_a_run_recorded_before_the_patch_replays() -> None:
    history = WorkflowHistory.from_json("unknown-tool-before", BEFORE.read_text())
    scheduled = [
        event.activity_task_scheduled_event_attributes.activity_type.name
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
    ]
    failed = [e for e in history.events if e.HasField("workflow_execution_failed_event_attributes")]
    assert scheduled == [] and len(failed) == 1, scheduled
    assert "UnknownTool" in str(failed[0].workflow_execution_failed_event_attributes.failure)
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
