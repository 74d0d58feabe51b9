"""`agentlease waiting` and `agentlease reconcile`, run as a user runs them, against a run stuck in
needs_reconciliation, ending with the run settled."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import pytest

from .runner import Background, Cli, WriteFile, processes_mentioning
from .test_cli import FAILED, assert_one_error_line, dev_exports, free_port

TOOLS = '''
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError
from agentlease.records import SettlementReceipt


class PageArgs(BaseModel):
    who: str


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=5), requires_approval=False)
async def page_oncall(ctx: LeaseContext, args: PageArgs) -> ToolResult:
    """Pages a person; the pager's API times out after accepting, so nobody knows if it went out."""
    await ctx.advance(Stage.PREFLIGHT, f"looking up {args.who}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"paging {args.who}")
    raise AmbiguousSideEffectError("pager API timed out after the request was sent")
'''

PLAN = {"steps": [{"step_id": "page", "tool": "page_oncall", "arguments": {"who": "sam"}}]}


@pytest.mark.timeout(240)
def test_waiting_and_reconcile_settle_a_stuck_run(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    write_file("acc_tools.py", TOOLS)
    write_file("page.json", json.dumps(PLAN))
    tools = {"PYTHONPATH": str(cli.cwd), "AGENTLEASE_TOOL_MODULES": "acc_tools"}
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()), env=tools)
    env = {**dev_exports(dev), **tools}
    dev.wait_for_line("Ctrl-C stops everything", timeout=10)

    stuck = cli("run", "page.json", "--wait", "--json", "--run-id", "acc-page", env=env, timeout=120)
    assert_one_error_line(stuck, FAILED, "acc-page waits for a person", "page is needs_reconciliation")
    assert json.loads(stuck.stdout)["tasks"][0]["stage"] == "external_call"

    listed = cli("waiting", env=env)
    assert listed.returncode == 0, listed
    assert "acc-page page: needs_reconciliation" in listed.stdout, listed
    assert "agentlease reconcile acc-page page --action confirm|retry|abandon" in listed.stdout, listed
    as_json = json.loads(cli("waiting", "--json", env=env).stdout)
    assert [(t["agent_run_id"], t["step_id"], t["status"]) for t in as_json] == [
        ("acc-page", "page", "needs_reconciliation")
    ]

    again = cli("run", "page.json", "--run-id", "acc-page", env=env)
    assert_one_error_line(again, FAILED, "cannot start run acc-page", "already running")

    # A decision nobody can take (no worker polls that queue) fails in one line, within the limit.
    nobody = {**env, "AGENTLEASE_TASK_QUEUE": "nobody-polls-this", "AGENTLEASE_DECISION_TIMEOUT": "2"}
    assert cli("run", "page.json", "--run-id", "acc-orphan", env=nobody).returncode == 0
    orphan = cli("cancel", "acc-orphan", "--by", "sam", "--reason", "no worker", env=nobody)
    assert_one_error_line(orphan, FAILED, "cancel: no worker took the decision for agent run acc-orphan within 2s")

    wrong = cli("approve", "acc-page", "page", "--by", "sam", "--reason", "oops", env=env)
    assert_one_error_line(wrong, 2, "approve refused", "not awaiting_approval")
    incomplete = cli("reconcile", "acc-page", "page", "--action", "confirm", "--by", "sam", "--reason", "x", env=env)
    assert_one_error_line(incomplete, 2, "confirm needs the external_id")

    decided = cli(
        "reconcile",
        "acc-page",
        "page",
        "--action",
        "confirm",
        "--external-id",
        "page-7781",
        "--observed",
        '{"acknowledged_by": "sam"}',
        "--by",
        "sam",
        "--reason",
        "pager shows it delivered",
        "--json",
        env=env,
    )
    assert decided.returncode == 0, decided
    status = json.loads(cli("status", "acc-page", "--json", env=env).stdout)
    assert status["status"] == "completed", status
    [task] = status["tasks"]
    assert task["status"] == "settled" and task["receipt"]["external_id"] == "page-7781", task

    assert json.loads(cli("waiting", "--json", env=env).stdout) == []
    trail = json.loads(cli("events", "--run", "acc-page", "--json", env=env).stdout)
    reconciled = [e for e in trail if e["kind"] == "reconciled"]
    assert reconciled and reconciled[0]["details"]["by"] == "sam", trail
    table = cli("events", "--run", "acc-page", env={**env, "COLUMNS": "300"})
    [row] = [line for line in table.stdout.splitlines() if " reconciled " in line]
    assert " sam " in row and "pager shows it delivered" in row, table

    # A closed terminal (SIGHUP) stops everything too.
    assert dev.stop(signal.SIGHUP) == 0, "".join(dev.stderr)
    assert processes_mentioning(str(cli.data_dir)) == []
