"""The CLI as an operator uses it: `dev --no-worker` with a worker started from its exports alone,
bulk `redrive` and `cancel` by filter (confirmation, `--yes`), `events --html`, not-found errors,
one set of names in tables and JSON, and a flag in `--help` for every setting."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

import pytest

from agentlease.settings import AgentLeaseSettings

from .conftest import fresh_pg_database
from .runner import Background, Cli, WriteFile
from .test_cli import FAILED, assert_one_error_line, free_port

BAD_INPUT = 2

TOOLS = '''
from datetime import timedelta

from pydantic import BaseModel

from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import PermanentToolError


class Args(BaseModel):
    target: str


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=30))
async def push_config(ctx: LeaseContext, args: Args) -> ToolResult:
    """The target rejects every request: dead-lettered on its first attempt."""
    await ctx.advance(Stage.PREFLIGHT, f"validating {args.target}")
    raise PermanentToolError(f"{args.target} rejects this config")


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=30))
async def wire_money(ctx: LeaseContext, args: Args) -> ToolResult:
    """Unsafe: waits for an approval before it runs."""
    raise AssertionError("never approved in this test")
'''


def plan(tool: str, target: str) -> str:
    return json.dumps({"steps": [{"step_id": "step", "tool": tool, "arguments": {"target": target}}]})


def exports(dev: Background) -> dict[str, str]:
    """Every variable of the `export` lines `agentlease dev` prints for a second shell; the plan its
    `agentlease run` line names exists where the command runs (the bundled plan, wherever installed)."""
    found: dict[str, str] = {}
    while True:
        line = dev.wait_for_line(r"export |agentlease run |Ctrl-C stops everything", timeout=120).string
        if "Ctrl-C stops everything" in line:
            return found
        if "agentlease run " in line:
            plan = shlex.split(line.strip())[2]
            assert (dev.cwd / plan).is_file(), f"agentlease dev names a plan that is not there: {line!r}"
            continue
        for word in shlex.split(line.strip())[1:]:
            name, _, value = word.partition("=")
            found[name] = value


@pytest.mark.timeout(300)
def test_bulk_decisions_html_timelines_and_not_found_against_a_dev_stack(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    write_file("ops_tools.py", TOOLS)
    for name, tool, target in (("push-a", "push_config", "a"), ("push-b", "push_config", "b")):
        write_file(f"{name}.json", plan(tool, target))
    write_file("wire.json", plan("wire_money", "acct"))
    tools = {"PYTHONPATH": str(cli.cwd), "AGENTLEASE_TOOL_MODULES": "ops_tools"}
    dev = background("dev", "--no-worker", "--port", str(free_port()), "--ui-port", str(free_port()), env=tools)
    dev.wait_for_line(r"worker:\s+none runs here \(--no-worker\)", timeout=120)
    env = exports(dev)
    assert env["AGENTLEASE_TOOL_MODULES"] == "ops_tools", env
    assert env["PYTHONPATH"] == str(cli.cwd), env
    assert {"AGENTLEASE_TEMPORAL_ADDRESS", "AGENTLEASE_TASK_QUEUE", "AGENTLEASE_LEDGER_URL"} <= set(env), env

    # A worker started from the exports alone serves the stack.
    worker = background("worker", env=env)
    banner = worker.wait_for_line(r"^worker on ", timeout=60).string
    assert f"queue {env['AGENTLEASE_TASK_QUEUE']} as " in banner, banner  # then its identity (host:pid)
    assert f":{worker.process.pid}, ledger " in banner, banner
    assert "push_config" in worker.wait_for_line(r"^tools: ", timeout=10).string

    for name in ("push-a", "push-b"):
        stuck = cli("run", f"{name}.json", "--wait", "--run-id", name, env=env, timeout=120)
        assert_one_error_line(stuck, FAILED, f"{name} waits for a person", "step is dead_lettered")
    assert cli("run", "wire.json", "--run-id", "wire", "--wait", env=env, timeout=120).returncode == FAILED

    decide = ("--by", "sam", "--reason", "target fixed")
    unasked = cli("redrive", "--tool", "push_config", *decide, env=env)
    assert_one_error_line(unasked, BAD_INPUT, "redrive of 2 task(s) needs a confirmation", "--yes")
    assert "push-a/step" in unasked.stdout and "push-b/step" in unasked.stdout, unasked
    wrong = cli("redrive", "--status", "settled", *decide, env=env)
    assert_one_error_line(wrong, BAD_INPUT, "bad --status settled", "redrive applies to")
    nothing = cli("redrive", "--tool", "no_such_tool", "--yes", *decide, env=env)
    assert_one_error_line(nothing, FAILED, "no task to redrive matches tool no_such_tool")
    both = cli("redrive", "push-a", "--tool", "push_config", *decide, env=env)
    assert_one_error_line(both, BAD_INPUT, "not both")

    redriven = cli("redrive", "--tool", "push_config", "--yes", "--json", *decide, env=env, timeout=120)
    assert redriven.returncode == 0, redriven
    assert sorted(o["task_id"] for o in json.loads(redriven.stdout)) == ["push-a/step", "push-b/step"]
    assert all(o["error"] is None for o in json.loads(redriven.stdout)), redriven.stdout
    for name in ("push-a", "push-b"):
        trail = json.loads(cli("events", f"{name}/step", "--json", env=env).stdout)
        assert [e["kind"] for e in trail].count("redriven") == 1, trail
        assert next(e for e in trail if e["kind"] == "redriven")["by"] == "sam"

    # One decision's answer: its heading says what its row says.
    single = cli("redrive", "push-a", "step", *decide, env={**env, "COLUMNS": "300"}, timeout=120)
    assert single.returncode == 0, single
    heading = single.stdout.strip().splitlines()[0].strip()
    [row] = [line for line in single.stdout.splitlines() if line.startswith("│ step ")]
    step_status = row.split("│")[3].strip()
    assert heading.endswith(f"after redrive, step step is {step_status}"), single.stdout

    cancelled = cli("cancel", "--run", "wire", "--status", "awaiting_approval", "--yes", *decide, env=env)
    assert cancelled.returncode == 0, cancelled
    assert "wire step: cancel sent" in cancelled.stdout, cancelled
    [task] = json.loads(cli("tasks", "--run", "wire", "--json", env=env).stdout)
    assert task["status"] == "cancelled", task

    # An incident review's file: the whole timeline, self-contained.
    written = cli("events", "push-a/step", "--html", "push-a.html", env=env)
    assert written.returncode == 0, written
    page = (cli.cwd / "push-a.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "redriven" in page, page[:300]
    assert "<script" not in page and "src=" not in page
    whole_run = cli("events", "--run", "push-b", "--html", "push-b.html", env=env)
    assert whole_run.returncode == 0, whole_run
    assert "push-b/step" in (cli.cwd / "push-b.html").read_text()
    assert_one_error_line(cli("events", "--run", "nope", "--html", "x.html", env=env), FAILED, "no agent run 'nope'")
    assert not (cli.cwd / "x.html").exists()

    # Not found is an error, never an empty table.
    assert_one_error_line(cli("tasks", "--run", "nope", env=env), FAILED, "no agent run 'nope'")
    assert_one_error_line(cli("events", "nope/x", env=env), FAILED, "no task 'nope/x'")
    assert_one_error_line(cli("status", "nope", env=env), FAILED, "agent run nope")

    # One set of names: every table header of tasks, events and waiting is a key of the same JSON.
    for args in (("tasks", "--run", "push-a"), ("events", "push-a/step"), ("waiting",)):
        table = cli(*args, env={**env, "COLUMNS": "400"}).stdout
        header = next(line for line in table.splitlines() if "task_id" in line)
        columns = [c.strip() for c in header.strip("┃ ").split("┃")]
        [record, *_] = json.loads(cli(*args, "--json", env=env).stdout)
        assert set(columns) <= set(record), (args, columns, sorted(record))
    waiting = json.loads(cli("waiting", "--json", env=env).stdout)
    assert all(w["suggested_commands"] for w in waiting), waiting

    assert worker.stop() == 0
    assert dev.stop() == 0


def test_every_setting_has_a_flag_that_help_shows(cli: Cli) -> None:
    wide = {"COLUMNS": "300"}
    # A setting's flag is on the command that uses it: global, worker, ui, codec-server, sweep or a decision.
    commands = ((), ("worker",), ("ui",), ("codec-server",), ("sweep",), ("approve",))
    shown = "".join(cli(*args, "--help", env=wide).stdout for args in commands)
    missing = [
        f"AGENTLEASE_{name.upper()}"
        for name in AgentLeaseSettings.model_fields
        if f"AGENTLEASE_{name.upper()}" not in shown
    ]
    assert missing == [], missing
    dev_help = cli("dev", "--help", env=wide).stdout
    assert "--no-worker" in dev_help and "worker" in dev_help.split("Options")[0], dev_help


def test_postgres_urls_are_accepted(cli: Cli) -> None:
    with fresh_pg_database("agentlease_pgurl") as url:
        libpq = url.replace("postgresql://", "postgres://", 1)
        upgraded = cli("db", "upgrade", env={"AGENTLEASE_LEDGER_URL": libpq})
        assert upgraded.returncode == 0, upgraded
        assert_one_error_line(cli("tasks", "--run", "nope", env={"AGENTLEASE_LEDGER_URL": libpq}), FAILED, "nope")
