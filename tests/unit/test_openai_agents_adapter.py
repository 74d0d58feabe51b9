"""The OpenAI Agents SDK adapter as pure logic: the schema the model sees, what it reads back, and a
core that works without the SDK installed."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="needs the openai-agents extra")

from agentlease.enums import StepEnd, TaskStatus
from agentlease.openai_agents._tools import leased_tool, tool_output
from agentlease.records import SettlementReceipt, TaskView
from agentlease.tools.builtin.http_get import http_get
from agentlease.tools.builtin.sql_upsert import sql_upsert
from agentlease.workflow._calls import CallOutcome

REPO = Path(__file__).resolve().parents[2]


def view(status: TaskStatus | StepEnd, **changes: object) -> TaskView:
    return TaskView(
        task_id="run/step", step_id="step", tool="smtp_send", status=status, idempotency_key="run:step", **changes
    )


def test_the_model_sees_the_argument_model_strict_when_it_allows() -> None:
    fetch = leased_tool(http_get)
    assert (fetch.name, fetch.strict_json_schema) == ("http_get", True)
    assert fetch.params_json_schema["required"] == ["url", "timeout_s"]
    assert fetch.params_json_schema["additionalProperties"] is False
    assert fetch.description.startswith("Fetch a URL")


def test_a_free_form_field_gives_a_non_strict_schema_and_names_can_change() -> None:
    upsert = leased_tool(sql_upsert, name="record", description="Record a row.")
    assert (upsert.name, upsert.description, upsert.strict_json_schema) == ("record", "Record a row.", False)
    assert upsert.params_json_schema["properties"]["row"]["type"] == "object"


def test_a_settled_call_reads_its_output_as_json() -> None:
    assert json.loads(tool_output("http_get", CallOutcome(view(TaskStatus.SETTLED), {"status_code": 200}))) == {
        "status_code": 200
    }


def test_a_call_settled_earlier_reads_its_receipt() -> None:
    receipt = SettlementReceipt(
        external_system="smtp", external_id="<m@x>", status="accepted", verified_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    read = json.loads(tool_output("smtp_send", CallOutcome(view(TaskStatus.SETTLED, receipt=receipt))))
    assert read["settled"] is True and read["receipt"]["external_id"] == "<m@x>"


@pytest.mark.parametrize(
    ("status", "error", "told"),
    [
        (
            TaskStatus.REJECTED,
            "rejected by bob: wrong recipient",
            "error: smtp_send was refused by an operator: it did not run and will not run"
            " (rejected by bob: wrong recipient)",
        ),
        (
            TaskStatus.ABANDONED,
            "abandoned by ann: not in the MTA log",
            "error: smtp_send was abandoned by an operator after an attempt whose effect is unknown: treat it as not"
            " done; it will not run again (abandoned by ann: not in the MTA log)",
        ),
        (
            TaskStatus.CANCELLED,
            "the run was cancelled",
            "error: smtp_send was cancelled: it will not run again (the run was cancelled)",
        ),
        (StepEnd.FAILED, "no worker serves it", "error: smtp_send failed (no worker serves it)"),
        (TaskStatus.DEAD_LETTERED, None, "error: smtp_send ended dead_lettered"),
    ],
)
def test_a_call_that_did_not_settle_reads_one_error_line(
    status: TaskStatus | StepEnd, error: str | None, told: str
) -> None:
    assert tool_output("smtp_send", CallOutcome(view(status, error=error))) == told


def test_the_core_imports_without_the_sdk() -> None:
    """The core, the worker, the plugin and the CLI never import ``agents``; only the adapter does."""
    code = (
        "import sys, agentlease, agentlease.workflow, agentlease.plugin, agentlease.cli.app, worker, "
        "agentlease.workflow._plan; print(sorted(m for m in ('agents', 'openai') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done
