"""`agentlease waiting`, `reconcile` and `approve`, run as a user runs them: a run stuck in
needs_reconciliation, ending with the run settled; an approval-gated refund that the approver sees
(its arguments, redacted, and their fingerprint) and approves by that fingerprint; and `waiting` and
`approve` agreeing while approvals expire at the claim again and again."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentlease.cli.app import app
from agentlease.enums import TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import arguments_fingerprint
from tests.eventually import assert_eventually

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



class RefundArgs(BaseModel):
    order_id: str
    amount_cents: int
    api_token: str


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=20))
async def refund(ctx: LeaseContext, args: RefundArgs) -> ToolResult:
    """Refunds an order: unsafe, so every call waits for a person's approval first."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"refunding {args.order_id}")
    return ToolResult(receipt=ctx.receipt("refunds", args.order_id, "refunded"))


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=20),
    approval_ttl=timedelta(milliseconds=1),
    name="hasty_refund",
)
async def hasty_refund(ctx: LeaseContext, args: RefundArgs) -> ToolResult:
    """A refund whose approval expires before any claim: every approval is refused at the claim."""
    raise AssertionError("an expired approval ran a refund")
'''

PLAN = {"steps": [{"step_id": "page", "tool": "page_oncall", "arguments": {"who": "sam"}}]}
REFUND = {"order_id": "A-1001", "amount_cents": 4200, "api_token": "sk_live_0123456789abcdef"}


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
    assert "agentlease reconcile acc-page page --action 'confirm|retry|abandon'" in listed.stdout, listed
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


def _dev(cli: Cli, background: Callable[..., Background], write_file: WriteFile) -> dict[str, str]:
    """`agentlease dev` serving the tools above; the variables a second shell exports."""
    write_file("acc_tools.py", TOOLS)
    tools = {"PYTHONPATH": str(cli.cwd), "AGENTLEASE_TOOL_MODULES": "acc_tools"}
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()), env=tools)
    env = {**dev_exports(dev), **tools}
    dev.wait_for_line("Ctrl-C stops everything", timeout=10)
    return env


def _start(cli: Cli, write_file: WriteFile, env: dict[str, str], run_id: str, tool: str) -> None:
    write_file(f"{run_id}.json", json.dumps({"steps": [{"step_id": "refund", "tool": tool, "arguments": REFUND}]}))
    assert cli("run", f"{run_id}.json", "--run-id", run_id, env=env).returncode == 0


async def _waiting_for_approval(cli: Cli, env: dict[str, str], run_id: str) -> dict[str, Any]:
    """The run's task as `waiting --json` lists it, once it waits for approval."""

    def listed() -> dict[str, Any]:
        listing = cli("waiting", "--json", env=env)
        assert listing.returncode == 0, listing
        tasks = [t for t in json.loads(listing.stdout) if t["agent_run_id"] == run_id]
        assert [t["status"] for t in tasks] == ["awaiting_approval"], tasks
        return tasks[0]

    return await assert_eventually(listed, timeout=120, interval=0.2, message=f"{run_id} awaits approval")


@pytest.mark.timeout(300)
async def test_the_approver_sees_the_call_and_approves_what_they_saw(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    env = _dev(cli, background, write_file)
    _start(cli, write_file, env, "acc-refund", "refund")
    fingerprint = arguments_fingerprint(REFUND)
    shown = {"order_id": "A-1001", "amount_cents": 4200, "api_token": "***"}

    task = await _waiting_for_approval(cli, env, "acc-refund")
    request = task["approval_request"]
    assert (request["tool"], request["arguments"], request["arguments_sha256"]) == ("refund", shown, fingerprint)
    table = cli("waiting", env={**env, "COLUMNS": "300"})
    assert "order_id: A-1001" in table.stdout and "amount_cents: 4200" in table.stdout, table
    assert f"--arguments-sha256 {fingerprint}" in table.stdout, table
    status = json.loads(cli("status", "acc-refund", "--json", env=env).stdout)
    assert status["tasks"][0]["approval_request"]["arguments"] == shown, status
    status_table = cli("status", "acc-refund", env={**env, "COLUMNS": "300"})
    assert "order_id: A-1001" in status_table.stdout and fingerprint in status_table.stdout, status_table
    [listed] = json.loads(cli("tasks", "--run", "acc-refund", "--json", env=env).stdout)
    assert listed["approval_request"]["arguments_sha256"] == fingerprint, listed
    port = free_port()
    ui = background("ui", "--port", str(port), env={"AGENTLEASE_LEDGER_URL": env["AGENTLEASE_LEDGER_URL"]})
    ui.wait_for_line("lease timelines on", timeout=60)
    async with httpx.AsyncClient() as http:
        page = (await http.get(f"http://127.0.0.1:{port}/", timeout=30)).text
    assert "order_id: A-1001" in page and "amount_cents: 4200" in page and "api_token: ***" in page, page
    assert f"<code class='sha256'>{fingerprint}</code>" in page, page
    for text in (table.stdout, status_table.stdout, json.dumps(status), json.dumps(listed), page):
        assert "sk_live" not in text

    other = arguments_fingerprint({**REFUND, "amount_cents": 420000})
    approve = ("approve", "acc-refund", "refund", "--by", "sam", "--reason", "customer called")
    refused = cli(*approve, "--arguments-sha256", other, env=env)
    assert_one_error_line(refused, 2, "approve refused", "not the ones you saw")
    approved = cli(*approve, "--arguments-sha256", fingerprint, "--json", env=env)
    assert approved.returncode == 0, approved

    def settled() -> None:
        run = json.loads(cli("status", "acc-refund", "--json", env=env).stdout)
        assert run["status"] == "completed" and run["tasks"][0]["status"] == "settled", run

    await assert_eventually(settled, timeout=120, interval=0.2, message="the approved refund settled")


CYCLES = 20
"""Refused-then-approved cycles of the agreement test."""


@pytest.mark.timeout(600)
async def test_waiting_and_approve_agree_while_approvals_expire_at_the_claim(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    """Each time `waiting` lists the task as awaiting approval and suggests `approve`, `approve` takes it, however
    soon after the claim refused the last approval as expired (the ledger moves first, the run learns it a moment
    later). The test watches the ledger `waiting` reads and runs both commands in this process, without a new
    interpreter's start between them, so that `approve` comes while the run may still be learning of the refusal."""
    env = _dev(cli, background, write_file)
    _start(cli, write_file, env, "acc-hasty", "hasty_refund")
    runner = CliRunner()
    ledger = Ledger.from_url(env["AGENTLEASE_LEDGER_URL"])

    async def run(*args: str) -> Any:
        return await asyncio.to_thread(runner.invoke, app, list(args), env=cli.env(env))

    async def asked_again() -> None:
        assert [t.status for t in await ledger.list_tasks("acc-hasty")] == [TaskStatus.AWAITING_APPROVAL]

    try:
        for cycle in range(CYCLES):
            await assert_eventually(asked_again, timeout=60, interval=0.002, message=f"cycle {cycle}: asked again")
            listing = await run("waiting", "--json")
            [task] = [t for t in json.loads(listing.stdout) if t["agent_run_id"] == "acc-hasty"]
            assert task["status"] == "awaiting_approval", task
            assert any(c.startswith("agentlease approve acc-hasty refund") for c in task["suggested_commands"]), task
            decided = await run("approve", "acc-hasty", "refund", "--by", "sam", "--reason", f"cycle {cycle}")
            assert decided.exit_code == 0, f"cycle {cycle}: `waiting` suggested approve, refused: {decided.output}"
    finally:
        await ledger.close()
    trail = json.loads(cli("events", "--run", "acc-hasty", "--json", env=env).stdout)
    refusals = [e for e in trail if e["kind"] == "approval_refused"]
    assert len(refusals) >= CYCLES - 1 and all(e["details"]["refused"] == "expired" for e in refusals), trail
    assert cli("reject", "acc-hasty", "refund", "--by", "sam", "--reason", "enough", env=env).returncode == 0
