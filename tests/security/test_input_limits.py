"""Hostile input through Temporal itself: ``temporal workflow start`` with a hand-written input, and
the ``submit`` and decision updates, against a real worker.

A bad plan fails its run at once with a non-retryable ``InvalidPlan`` error saying what is wrong; a
bad update is refused by its validator, leaving no history; nothing is retried forever
(``docs/limits.md``; ``docs/security-input.md``, "Hostile input").
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError

from agentlease import limits
from agentlease.enums import TaskStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.devserver import temporal_binary
from agentlease.settings import AgentLeaseSettings
from tests.eventually import assert_eventually
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_builtin_tools import serving

pytestmark = pytest.mark.timeout(120)

FAILS_WITHIN_S = 30.0
"""A bad plan's run must have failed by then (it used to retry its workflow task forever)."""

STEP = {"step_id": "s", "tool": "quick", "arguments": {}}


def _start_by_hand(address: str, queue: str, workflow_id: str, text: str, tmp_path: Path) -> None:
    """``temporal workflow start`` with ``text`` as the input, as an operator would type it."""
    (tmp_path / "input.json").write_text(text)
    started = subprocess.run(
        [
            str(temporal_binary()),
            "workflow",
            "start",
            "--address",
            address,
            "--task-queue",
            queue,
            "--type",
            "AgentRunWorkflow",
            "--workflow-id",
            workflow_id,
            "--input-file",
            str(tmp_path / "input.json"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert started.returncode == 0, started.stderr


async def _fails_as_invalid_plan(client: Client, workflow_id: str, failure: str = "InvalidPlan") -> str:  # noqa: F811
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), timeout=FAILS_WITHIN_S)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == failure, cause
    return cause.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(json.dumps({"steps": [{**STEP, "step_id": "s" * 128}]}), "agent run id has 200", id="long-ids"),
        pytest.param(json.dumps({"steps": [{**STEP, "tool": "qui\u0000ck"}]}), "NUL", id="nul"),
        pytest.param(
            '{"steps": [{"step_id": "s", "tool": "quick", "arguments": {"a": ' + "[" * 100 + "]" * 100 + "}}]}",
            "nested deeper than",
            id="nested-100",
        ),
        pytest.param(json.dumps({"keep_open": "yes", "steps": [STEP]}), "keep_open", id="keep-open-yes"),
        pytest.param(
            json.dumps({"steps": [{**STEP, "step_id": f"s{i}"} for i in range(limits.MAX_STEPS_PER_RUN + 1)]}),
            "at most 1000 items",
            id="too-many-steps",
        ),
    ],
)
async def test_hand_written_start_fails_the_run_at_once(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
    temporal_address: str,
    tmp_path: Path,
    text: str,
    fragment: str,
) -> None:
    workflow_id = "w" * 200 if "s" * 128 in text else f"sec-{uuid.uuid4().hex[:10]}"
    async with serving(client, settings, "worker-limits"):
        _start_by_hand(temporal_address, settings.task_queue, workflow_id, text, tmp_path)
        message = await _fails_as_invalid_plan(client, workflow_id)
    assert fragment in message, message


@pytest.mark.parametrize("depth", [500, 3000])
async def test_hand_written_start_too_deep_to_decode_fails_the_run_at_once(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
    temporal_address: str,
    tmp_path: Path,
    depth: int,
) -> None:
    """Deeper than the data converter decodes: the run fails with the converter's error instead of
    retrying its first workflow task forever."""
    text = '{"steps": [{"step_id": "s", "tool": "quick", "arguments": {"a": ' + "[" * depth + "]" * depth + "}}]}"
    workflow_id = f"sec-{uuid.uuid4().hex[:10]}"
    async with serving(client, settings, "worker-limits"):
        _start_by_hand(temporal_address, settings.task_queue, workflow_id, text, tmp_path)
        message = await _fails_as_invalid_plan(client, workflow_id, "ValidationError")
    assert "recursion limit exceeded" in message, message


async def test_start_with_nan_fails_the_run_at_once(client: Client, settings: AgentLeaseSettings) -> None:  # noqa: F811
    """The SDK's JSON converter writes NaN and Infinity (Python's ``json`` does); the run refuses them."""
    workflow_id = f"sec-{uuid.uuid4().hex[:10]}"
    plan = {"steps": [{**STEP, "arguments": {"x": float("nan"), "y": float("inf")}}]}
    async with serving(client, settings, "worker-limits"):
        await client.start_workflow("AgentRunWorkflow", plan, id=workflow_id, task_queue=settings.task_queue)
        message = await _fails_as_invalid_plan(client, workflow_id)
    assert "which JSON cannot carry" in message, message


@pytest.fixture
async def open_run(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
) -> AsyncIterator[WorkflowHandle[Any, RunStatus]]:
    """A running ``keep_open`` run with one settled step ``s`` (a ``quick``), served by a worker."""
    run_id = f"sec-{uuid.uuid4().hex[:10]}"
    plan = AgentRunPlan(agent_run_id=run_id, keep_open=True, steps=[PlanStep(step_id="s", tool="quick")])
    async with serving(client, settings, "worker-limits"):
        handle = await client.start_workflow(
            "AgentRunWorkflow", plan, id=run_id, task_queue=settings.task_queue, result_type=RunStatus
        )

        async def settled() -> bool:
            status = await handle.query("status", result_type=RunStatus)
            return [t.status for t in status.tasks] == [TaskStatus.SETTLED]

        await assert_eventually(settled, timeout=FAILS_WITHIN_S, message="step s settles")
        yield handle
        await handle.terminate("test over")


async def _refused(handle: WorkflowHandle[Any, RunStatus], update: str, payload: Any) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(update, payload)
    return str(getattr(refused.value.cause, "message", refused.value.cause))


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        pytest.param({**STEP, "step_id": "t", "arguments": {"a": float("nan")}}, "JSON cannot carry", id="nan"),
        pytest.param({**STEP, "step_id": "t", "idempotency_key": "k\u0000"}, "NUL", id="nul-key"),
        pytest.param({**STEP, "step_id": "t", "arguments": {"a": "x" * 70_000}}, "more than 65536", id="large"),
    ],
)
async def test_submit_refuses_hostile_steps(
    open_run: WorkflowHandle[Any, RunStatus], payload: dict[str, Any], fragment: str
) -> None:
    message = await _refused(open_run, "submit", payload)
    assert fragment in message, message
    status = await open_run.query("status", result_type=RunStatus)
    assert [t.step_id for t in status.tasks] == ["s"], status


@pytest.mark.parametrize(
    ("update", "payload", "fragment"),
    [
        pytest.param("approve", {"step_id": "s", "by": "sam\u0000", "reason": "ok"}, "NUL", id="nul-by"),
        pytest.param(
            "reconcile",
            {"step_id": "s", "by": "sam", "reason": "seen", "action": "confirm", "external_id": "x" * 1_500_000},
            "at most 1024 characters",
            id="external-id-1.5MB",
        ),
        pytest.param(
            "reconcile",
            {
                "step_id": "s",
                "by": "sam",
                "reason": "seen",
                "action": "confirm",
                "external_id": "x",
                "observed": {"a": "y" * 20_000},
            },
            "more than 16384",
            id="observed-large",
        ),
        pytest.param(
            "cancel", {"step_id": "s" * 129, "by": "sam", "reason": "x"}, "at most 128 characters", id="long-step"
        ),
    ],
)
async def test_decisions_refuse_hostile_payloads(
    open_run: WorkflowHandle[Any, RunStatus], update: str, payload: dict[str, Any], fragment: str
) -> None:
    message = await _refused(open_run, update, payload)
    assert fragment in message, message
    # The run goes on: it still answers and still takes a good step.
    await open_run.execute_update("submit", {**STEP, "step_id": "after"})
    status = await open_run.query("status", result_type=RunStatus)
    assert [t.step_id for t in status.tasks] == ["s", "after"], status


@pytest.mark.parametrize(
    ("update", "text", "fragment"),
    [
        pytest.param("submit", '{"step_id": "t", "tool": "quick", "idempotency_key": "k\\u0000"}', "NUL", id="nul"),
        pytest.param(
            "submit",
            '{"step_id": "t", "tool": "quick", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}",
            "nested deeper than",
            id="nested",
        ),
        pytest.param(
            "reconcile",
            '{"step_id": "s", "by": "sam", "reason": "x", "action": "confirm", "external_id": "' + "x" * 5000 + '"}',
            "at most 1024 characters",
            id="external-id",
        ),
    ],
)
async def test_hand_written_update_is_refused(
    open_run: WorkflowHandle[Any, RunStatus],
    temporal_address: str,
    tmp_path: Path,
    update: str,
    text: str,
    fragment: str,
) -> None:
    """``temporal workflow update execute`` with a hand-written input, as an operator would type it."""
    (tmp_path / "update.json").write_text(text)
    args = ["workflow", "update", "execute", "--address", temporal_address, "--workflow-id", open_run.id]
    args += ["--name", update, "--input-file", str(tmp_path / "update.json")]
    process = await asyncio.create_subprocess_exec(
        str(temporal_binary()), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode != 0
    assert fragment in stderr.decode(), stderr
    status = await open_run.query("status", result_type=RunStatus)
    assert [t.step_id for t in status.tasks] == ["s"], status
