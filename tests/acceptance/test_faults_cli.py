"""The command line under faults, run as a user runs it: a cancel that must not wait for a tool that does
not renew, a cancel of an unsafe call whose effect is unknown (``waiting``, ``reconcile``), ``status``
right after the run's worker died."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.eventually import assert_eventually_sync

from .fleet import Fleet
from .runner import Background, Cli, WriteFile, python_path
from .test_cli import FAILED, assert_one_error_line, dev_exports, free_port

pytestmark = pytest.mark.timeout(240)

TOOLS = '''
import asyncio
from datetime import timedelta

from pydantic import BaseModel

from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage


class Args(BaseModel):
    what: str = "x"


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=20))
async def slow_export(ctx: LeaseContext, args: Args) -> ToolResult:
    """Works for minutes without renewing: a cancel reaches it only with its next heartbeat."""
    await ctx.advance(Stage.PREFLIGHT, "preparing the export")
    await asyncio.sleep(600)
    return ToolResult(receipt=ctx.receipt("export", args.what, "done"))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=5), requires_approval=False)
async def send_note(ctx: LeaseContext, args: Args) -> ToolResult:
    """Unsafe: its message may be on its way while it waits for the mail server."""
    await ctx.advance(Stage.PREFLIGHT, f"checking {args.what}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.what}")
    while True:
        await asyncio.sleep(0.3)
        await ctx.renew("waiting for the mail server")
'''


def plan(tool: str) -> str:
    return json.dumps({"steps": [{"step_id": "only", "tool": tool, "arguments": {"what": "sam"}}]})


def task_of(cli: Cli, env: dict[str, str], run_id: str) -> dict[str, Any]:
    listed = cli("tasks", "--run", run_id, "--json", env=env)
    assert listed.returncode == 0, listed
    tasks = json.loads(listed.stdout)
    assert len(tasks) == 1, tasks
    return dict(tasks[0])


def test_cancel_answers_within_its_limit_and_an_unknown_effect_waits_for_a_person(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    write_file("acc_tools.py", TOOLS)
    write_file("export.json", plan("slow_export"))
    write_file("note.json", plan("send_note"))
    tools = {
        "PYTHONPATH": python_path(cli.cwd),
        "AGENTLEASE_TOOL_MODULES": "acc_tools",
    }
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()), env=tools)
    env = {**dev_exports(dev), **tools, "AGENTLEASE_DECISION_TIMEOUT": "5"}
    dev.wait_for_line("Ctrl-C stops everything", timeout=10)

    # A tool that does not renew learns of a cancel only at its next heartbeat (0.8 x a 20 s TTL):
    # the command answers within its own 5 s limit all the same, with the run as it is after the cancel.
    # It has not reached its external call, so nothing can have happened: plainly cancelled.
    assert cli("run", "export.json", "--run-id", "acc-export", env=env).returncode == 0
    assert_eventually_sync(lambda: task_of(cli, env, "acc-export")["status"] == "running", timeout=60)
    cancelled = cli("cancel", "acc-export", "--by", "sam", "--reason", "not needed", "--json", env=env)
    assert cancelled.returncode == 0, cancelled
    shown = json.loads(cancelled.stdout)
    assert (shown["status"], [t["status"] for t in shown["tasks"]]) == ("cancelled", ["cancelled"]), shown
    assert "the cancel is recorded in the ledger" in cancelled.stderr, cancelled
    assert task_of(cli, env, "acc-export")["status"] == "cancelled"

    # An unsafe call cancelled in external_call: cancelled, and its effect unknown until a person says.
    assert cli("run", "note.json", "--run-id", "acc-note", env=env).returncode == 0
    assert_eventually_sync(lambda: task_of(cli, env, "acc-note")["stage"] == "external_call", timeout=60)
    note = cli("cancel", "acc-note", "--by", "sam", "--reason", "wrong recipient", "--json", env=env)
    assert note.returncode == 0, note
    assert [t["status"] for t in json.loads(note.stdout)["tasks"]] == ["cancelled_effect_unknown"], note

    def ended() -> None:
        status = cli("status", "acc-note", "--json", env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["status"] == "cancelled", status

    assert_eventually_sync(ended, timeout=60, message="the cancelled run ended")
    listed = cli("waiting", env={**env, "COLUMNS": "300"})
    assert listed.returncode == 0, listed
    assert "acc-note only: cancelled_effect_unknown: cancelled, but its side effect may have happened" in (
        listed.stdout
    ), listed
    assert "agentlease reconcile acc-note only --action 'confirm|abandon' --by WHO --reason WHY" in listed.stdout
    assert "acc-export" not in listed.stdout, listed

    retry = cli("reconcile", "acc-note", "only", "--action", "retry", "--by", "sam", "--reason", "x", env=env)
    assert_one_error_line(retry, 2, "reconcile refused", "cancelled_effect_unknown")
    confirmed = cli(
        "reconcile",
        "acc-note",
        "only",
        "--action",
        "confirm",
        "--external-id",
        "<m-42@mx>",
        "--by",
        "sam",
        "--reason",
        "the MTA log shows it sent",
        "--json",
        env=env,
    )
    assert confirmed.returncode == 0, confirmed
    assert json.loads(confirmed.stdout)["status"] == "cancelled", confirmed
    assert json.loads(cli("waiting", "--json", env=env).stdout) == []
    trail = json.loads(cli("events", "--run", "acc-note", "--json", env=env).stdout)
    kinds = [(e["kind"], (e["details"] or {}).get("decision"), (e["details"] or {}).get("effect")) for e in trail]
    assert ("cancelled", "cancel", "unknown") in kinds and ("reconciled", "confirm_effect", None) in kinds, kinds

    assert dev.stop(signal.SIGINT) == 0, "".join(dev.stderr)


def test_status_right_after_the_runs_worker_died(
    cli: Cli, temporal_address: str, tmp_path: Path, write_file: WriteFile
) -> None:
    """The run's worker is killed; `status` answers from another worker, or says why not and where to look."""
    write_file("acc_tools.py", TOOLS)
    write_file("note.json", plan("send_note"))
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(
        temporal_address,
        ledger_url,
        cli,
        "acc_tools",
        {"PYTHONPATH": python_path(cli.cwd)},
    )
    env = {
        "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
        "AGENTLEASE_TASK_QUEUE": queue,
        "AGENTLEASE_LEDGER_URL": ledger_url,
        "AGENTLEASE_TOOL_MODULES": "acc_tools",
        "PYTHONPATH": python_path(cli.cwd),
        "AGENTLEASE_DECISION_TIMEOUT": "20",
    }
    try:
        assert cli("db", "upgrade", env=env).returncode == 0
        first = fleet.start(queue, f"{queue}-first")
        assert cli("run", "note.json", "--run-id", queue, env=env).returncode == 0
        assert_eventually_sync(lambda: task_of(cli, env, queue)["stage"] == "external_call", timeout=90)
        second = fleet.start(queue, f"{queue}-second")
        second.command.wait_for_line("worker on", timeout=60)
        first.stop(signal.SIGKILL)
        shown = cli("status", queue, "--json", env=env)
        assert shown.returncode == 0, shown
        assert json.loads(shown.stdout)["agent_run_id"] == queue

        second.stop(signal.SIGKILL)
        alone = cli("status", queue, env={**env, "AGENTLEASE_DECISION_TIMEOUT": "3"})
        assert_one_error_line(alone, FAILED, "no worker answered its status query", f"agentlease tasks --run {queue}")
    finally:
        for worker in fleet.started:
            worker.stop()
