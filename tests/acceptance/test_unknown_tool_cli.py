"""A run whose plan names a tool no worker serves, seen from the command line as a user sees it.

``agentlease dev`` runs a worker that serves ``acc_tools``; the run is started from a shell whose tool
modules also hold ``acc_extra.export_report``, so ``agentlease run`` accepts the plan, and the worker
fails the run with ``UnknownTool`` (after the catalog's patience, 30 s). Before, the run was ``failed`` in
``agentlease status`` but unknown to the ledger: ``agentlease runs`` did not list it and ``agentlease tasks
--run`` answered "no agent run". Now the run records the step before it fails: both list it as failed,
with the unknown tool named in one line.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import pytest
from temporalio.client import Client

from tests.eventually import assert_eventually_sync
from tests.integration.test_replay import replayer

from .runner import Background, Cli, WriteFile, python_path
from .test_cli import FAILED, assert_one_error_line, dev_exports, free_port

pytestmark = pytest.mark.timeout(240)

SERVED = '''
from datetime import timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool


class Args(BaseModel):
    what: str = "x"


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=20))
async def fetch_page(ctx: LeaseContext, args: Args) -> ToolResult:
    """Served by the worker."""
    await ctx.advance(Stage.PREFLIGHT, f"fetching {args.what}")
    return ToolResult(receipt=ctx.receipt("pages", args.what, "read"))
'''

EXTRA = '''
from datetime import timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool


class Args(BaseModel):
    what: str = "x"


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=20))
async def export_report(ctx: LeaseContext, args: Args) -> ToolResult:
    """Known to the shell that starts the run, served by no worker."""
    return ToolResult(receipt=ctx.receipt("reports", args.what, "exported"))
'''

RUN = "acc-unknown-tool"


def test_a_run_naming_a_tool_no_worker_serves_is_listed_failed_with_the_tool(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    write_file("acc_tools.py", SERVED)
    write_file("acc_extra.py", EXTRA)
    steps = [
        {"step_id": "fetch", "tool": "fetch_page", "arguments": {"what": "runbook"}},
        {"step_id": "export", "tool": "export_report", "arguments": {"what": "q3"}},
    ]
    write_file("plan.json", json.dumps({"steps": steps}))
    served = {"PYTHONPATH": python_path(cli.cwd), "AGENTLEASE_TOOL_MODULES": "acc_tools"}
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()), env=served)
    env = {**dev_exports(dev), **served, "COLUMNS": "250"}
    dev.wait_for_line("Ctrl-C stops everything", timeout=10)

    shell = {**env, "AGENTLEASE_TOOL_MODULES": "acc_tools,acc_extra"}  # this shell knows one tool more
    started = cli("run", "plan.json", "--run-id", RUN, env=shell)
    assert started.returncode == 0, started

    def failed() -> None:
        assert_one_error_line(cli("status", RUN, env=env), FAILED, f"agent run {RUN} failed", "export_report")

    assert_eventually_sync(failed, timeout=120, interval=1, message="the run failed on its unknown tool")

    def listed() -> str:
        runs = cli("runs", env=env)
        assert runs.returncode == 0 and "Traceback" not in runs.stdout + runs.stderr, runs
        assert re.search(rf"{RUN}\s.*failed", runs.stdout), runs
        return runs.stdout

    runs = assert_eventually_sync(listed, timeout=30, interval=0.5, message="agentlease runs lists the run")
    [why] = [line for line in runs.splitlines() if line.startswith(f"{RUN}: failed: ")]
    assert "unknown tool 'export_report' (step export)" in why, runs

    runs_json = {r["agent_run_id"]: r for r in json.loads(cli("runs", "--json", env=env).stdout)}
    assert runs_json[RUN]["status"] == "failed" and "export_report" in runs_json[RUN]["error"], runs_json
    only_failed = cli("runs", "--status", "failed", env=env)
    assert only_failed.returncode == 0 and RUN in only_failed.stdout, only_failed

    tasks = cli("tasks", "--run", RUN, env=env)
    assert tasks.returncode == 0 and "Traceback" not in tasks.stdout + tasks.stderr, tasks
    assert re.search(rf"{RUN}/export\s.*export_report\s.*cancelled", tasks.stdout), tasks
    assert f"{RUN}/fetch" not in tasks.stdout, tasks  # a step that never ran and names a served tool is not there
    [line] = [line for line in tasks.stdout.splitlines() if line.startswith(f"{RUN} export: ")]
    assert line.startswith(f"{RUN} export: the run failed: unknown tool 'export_report' (step export)"), tasks

    [task] = json.loads(cli("tasks", "--run", RUN, "--json", env=env).stdout)
    assert (task["status"], task["error_class"]) == ("cancelled", "unknown_tool"), task
    events = json.loads(cli("events", "--run", RUN, "--json", env=env).stdout)
    assert [(e["kind"], e["by"]) for e in events] == [("cancelled", "agentlease")], events
    assert "export_report" in events[0]["reason"], events
    waiting = cli("waiting", env=env)
    assert waiting.returncode == 0 and RUN not in waiting.stdout, waiting  # nothing for a person to decide
    asyncio.run(replays(env["AGENTLEASE_TEMPORAL_ADDRESS"]))


async def replays(address: str) -> None:
    """The run's history (its catalog's failed workflow tasks, the record, the failure) replays."""
    client = await Client.connect(address)
    history = await client.get_workflow_handle(RUN).fetch_history()
    kinds = [event.activity_task_scheduled_event_attributes.activity_type.name for event in history.events]
    assert "agentlease.record_unknown_tools" in kinds, kinds
    await replayer().replay_workflow(history)
