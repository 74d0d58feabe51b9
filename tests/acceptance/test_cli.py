"""The ``agentlease`` command line as a user runs it: the installed console script, in a subprocess.

Each test asserts on the exit code, stdout and stderr. A failure is one line on stderr starting with
``error:``, with exit code 2 for bad input and 1 for a failed operation, and never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url
from temporalio.client import Client

from agentlease.observability.metrics import SCOPE
from tests.eventually import assert_eventually_sync

from .runner import AGENTLEASE, Background, Cli, CliResult, WriteFile, processes_mentioning

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_PLANS = sorted((REPO / "agentlease" / "demo" / "plans").glob("*.json"))
RESTOCK_PLAN = REPO / "agentlease" / "demo" / "plans" / "restock.json"

BAD_INPUT = 2
FAILED = 1

UNREACHABLE_TEMPORAL = {"AGENTLEASE_TEMPORAL_ADDRESS": "127.0.0.1:1"}
FAIL_FAST_S = 15.0
"""An unreachable server must be reported within this many seconds (the SDK alone may take 30s)."""


def assert_one_error_line(result: CliResult, exit_code: int, *fragments: str) -> str:
    """The run failed with ``exit_code`` and one ``error:`` line on stderr containing ``fragments``."""
    assert result.returncode == exit_code, result
    assert "Traceback" not in result.stdout + result.stderr, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith("error: "), result
    for fragment in fragments:
        assert fragment in lines[0], result
    return lines[0]


def settled_task_count() -> int:
    return sum(len(json.loads(plan.read_text())["steps"]) for plan in EXAMPLE_PLANS)


# -- demo ------------------------------------------------------------------------------------------


def demo_as_a_user(cli: Cli) -> CliResult:
    """``agentlease demo`` outside a test runner, read by an agent (``AI_AGENT=1``): where third-party
    libraries show their banners (Pydantic AI's, pointing at Logfire), which a test runner hides."""
    env = {k: v for k, v in cli.env({"AI_AGENT": "1"}).items() if k not in ("PYTEST_VERSION", "CI")}
    started = time.monotonic()
    done = subprocess.run(
        [str(AGENTLEASE), "demo"],
        check=False,
        cwd=cli.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
    )
    return CliResult(("demo",), done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def landed_writes(target: Path, record_key: str) -> list[str]:
    """Who wrote ``runbooks/<record_key>`` of the demo's SQL target, one entry per write that landed."""
    with contextlib.closing(sqlite3.connect(target)) as db:
        query = "SELECT written_by FROM runbook_writes WHERE record_key = ? ORDER BY write_id"
        return [row[0] for row in db.execute(query, (record_key,))]


@pytest.mark.timeout(300)
def test_demo_tells_what_a_lease_changes_and_stops_everything(cli: Cli, background: Callable[..., Background]) -> None:
    result = demo_as_a_user(cli)

    assert result.returncode == 0, result
    assert "Traceback" not in result.stdout + result.stderr, result
    out = result.stdout

    # One story, counted at the downstream: without a lease two writes land, with agentlease one.
    target = cli.data_dir / "target.db"
    plain_key = re.search(r"^1\. Without a lease: a plain Temporal activity writes runbooks/(\S+) ", out, re.M)
    leased_key = re.search(r"^2\. With agentlease: a leased tool writes runbooks/(\S+) ", out, re.M)
    assert plain_key is not None and leased_key is not None, result
    without = re.search(r"=> without a lease: (\d+) writes? landed: (.*)$", out, re.M)
    with_lease = re.search(r"=> with agentlease: (\d+) writes? landed: (.*); (.*)$", out, re.M)
    assert without is not None and with_lease is not None, result
    plain_writes, leased_writes = landed_writes(target, plain_key[1]), landed_writes(target, leased_key[1])
    assert int(without[1]) == len(plain_writes) == 2, (plain_writes, result)
    assert without[2] == ", then ".join(plain_writes), result
    assert plain_writes == ["attempt 2 (plain-worker-b)", "attempt 1 (plain-worker-a)"], plain_writes
    assert int(with_lease[1]) == len(leased_writes) == 1, (leased_writes, result)
    assert leased_writes == ["generation 2 (demo-worker-b)"] and with_lease[2] == leased_writes[0], result
    assert with_lease[3] == "the late write of generation 1 was refused", result

    # Narrated live on stderr, from what Temporal, the ledger and the downstream recorded.
    err = result.stderr
    assert re.search(r"paused plain-worker-a \(SIGSTOP\)", err), result
    assert re.search(r"retried the activity: attempt 2 \(plain-worker-b\) wrote the row", err), result
    assert re.search(r"took over with generation 2, wrote the row \(fencing token 2\) and settled", err), result
    assert "refused: renewal of generation 1 (lease_lost)" in err, result
    assert re.search(r"refused: downstream write by generation 1: .* refused by the fence", err), result
    assert "refused: settle of generation 1 (late_unapplied)" in err, result

    # One Temporal banner (the demo's own line); the dev server's went to its log; no third-party banner.
    assert len(re.findall(r"Temporal dev server \d", out + err)) == 1, result
    assert "Temporal CLI" not in out + err and "Temporal Server:" not in out + err, result
    assert "Temporal CLI" in (cli.data_dir / "temporal-server.log").read_text()
    assert "logfire" not in (out + err).lower() and "PYDANTIC_AI_NO_BANNER" not in out + err, result

    # The final table fits 100 columns.
    table = [line for line in out.splitlines() if line[:1] in set("┏┃┡│└")]
    assert len(table) >= 7 and max(len(line) for line in table) <= 100, result
    assert re.search(r"│ writes that landed\s+│ 2\s+│ 1\s+│", out), result

    # The plans and the agents, in a few lines; every task settled.
    batch = re.search(r"beside it, as runs demo-\*-(\w+): (\d+) plans, (\d+) tool calls", out)
    assert batch is not None and int(batch[2]) == len(EXAMPLE_PLANS), result
    assert int(batch[3]) == settled_task_count(), result
    assert re.search(r"2 agents on OpenAI Agents SDK and Pydantic AI, scripted models \(no API key\)", out)
    counted = re.search(r"(\d+)/(\d+) tasks settled", out)
    assert counted is not None and counted[1] == counted[2], result
    assert len(out.splitlines()) <= 40, result

    # The dev server, its UI, the paused workers and everything else the demo started are gone.
    assert processes_mentioning(str(cli.data_dir)) == []
    assert processes_mentioning(f"plain-{batch[1]}") == []

    # The ledger the demo left behind agrees, read back through the CLI.
    ledger = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.data_dir / 'ledger.db'}"}
    listed = cli("tasks", "--json", env=ledger)
    assert listed.returncode == 0, listed
    tasks = json.loads(listed.stdout)
    assert len(tasks) == int(counted[1]), listed
    assert all(task["agent_run_id"].endswith(f"-{batch[1]}") for task in tasks), listed
    assert len({task["agent_run_id"] for task in tasks}) == len(EXAMPLE_PLANS) + 2 + 1, listed
    assert all(task["status"] == "settled" and task["receipt"] is not None for task in tasks), listed
    [task] = [t for t in tasks if t["agent_run_id"] == f"demo-takeover-{batch[1]}"]
    assert task["claim_generation"] == 2, task

    # `tasks` says since when the holder holds it: the claim of the current generation.
    trail = json.loads(cli("events", task["task_id"], "--json", env=ledger).stdout)
    [claim_2] = [e for e in trail if (e["kind"], e["claim_generation"]) == ("claimed", 2)]
    assert datetime.fromisoformat(task["since"]) == datetime.fromisoformat(claim_2["at"]), (task, claim_2)
    rows = cli("tasks", "--run", task["agent_run_id"], env={**ledger, "COLUMNS": "250"})
    header = next(line for line in rows.stdout.splitlines() if "lease_owner" in line)
    assert re.search(r"lease_owner\s+┃ since\s+┃", header) and "trace_id" not in header, rows  # no trace: no column
    shown_since = datetime.fromisoformat(task["since"]).isoformat(timespec="seconds")
    assert re.search(rf"demo-worker-b\s+│ {re.escape(shown_since)}\s+│", rows.stdout), rows

    # `events --kind/--generation`: what the attempt that lost its lease was refused, and nothing else.
    refused = cli(
        "events", "--run", task["agent_run_id"], "--kind", "lease_lost,late_unapplied", "--generation", "1",
        "--json", env=ledger,
    )  # fmt: skip
    assert refused.returncode == 0, refused
    expected = [e for e in trail if e["kind"] in ("lease_lost", "late_unapplied") and e["claim_generation"] == 1]
    assert json.loads(refused.stdout) == expected and len(expected) >= 2, refused
    claims = cli("events", task["task_id"], "--kind", "claimed", env={**ledger, "COLUMNS": "250"})
    assert f"evidence trail of {task['task_id']} (kind claimed)" in claims.stdout, claims
    assert len(re.findall(r"│ claimed\s+│", claims.stdout)) == 2, claims  # generations 1 and 2
    assert_one_error_line(cli("events", task["task_id"], "--kind", "nap", env=ledger), BAD_INPUT, "bad --kind 'nap'")

    # Where to look: the commands run as printed, from the same directory.
    commands = [shlex.split(line) for line in out.splitlines() if re.match(r"^   \S*agentlease ", line)]
    by_command = {argv[-1] if argv[-1] in ("ui", "dev") else argv[-2]: argv for argv in commands}
    assert set(by_command) == {"events", "ui", "dev"}, result
    for argv in commands:
        assert argv[0] == "agentlease" or Path(argv[0]).resolve() == AGENTLEASE.resolve(), argv
    printed = subprocess.run(
        by_command["events"], cwd=cli.cwd, env=cli.env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert printed.returncode == 0, printed
    assert "late_unapplied" in printed.stdout and "lease_lost" in printed.stdout, printed
    assert f"http://127.0.0.1:8080/ (task /tasks/{task['task_id']})" in out, result

    # `dev`, as printed (on free ports here), brings Temporal back on the demo's data: both runs are there.
    dev = background(*by_command["dev"][1:], "--port", str(free_port()), "--ui-port", str(free_port()))
    address = dev.wait_for_line(r"Temporal server:\s+(\S+)", timeout=120)[1]
    plain_run = re.search(r"/workflows/(demo-plain-\S+) ", out)
    assert plain_run is not None, result
    plain_attempts, leased_status = asyncio.run(_demo_runs(address, plain_run[1], task["agent_run_id"]))
    assert plain_attempts == 2 and leased_status == "COMPLETED", (plain_attempts, leased_status)
    assert dev.stop(signal.SIGINT) == 0, "".join(dev.stderr)


async def _demo_runs(address: str, plain_run: str, leased_run: str) -> tuple[int, str]:
    """The attempt that completed the plain activity, and the leased run's status, from Temporal."""
    client = await Client.connect(address)
    history = await client.get_workflow_handle(plain_run).fetch_history()
    [started] = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    described = await client.get_workflow_handle(leased_run).describe()
    assert described.status is not None
    return started.activity_task_started_event_attributes.attempt, described.status.name


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.timeout(240)
def dev_exports(dev: Background) -> dict[str, str]:
    """The variables `agentlease dev` tells a second shell to export."""
    first = dev.wait_for_line(r"export (AGENTLEASE_TEMPORAL_ADDRESS=\S+) (AGENTLEASE_TASK_QUEUE=\S+)", timeout=120)
    second = dev.wait_for_line(r"export (AGENTLEASE_LEDGER_URL=\S+)", timeout=10)
    return dict(pair.split("=", 1) for pair in (*first.groups(), *second.groups()))


def test_dev_serves_runs_started_from_another_shell_and_stops_on_ctrl_c(
    cli: Cli, background: Callable[..., Background], write_file: WriteFile
) -> None:
    metrics_address = f"127.0.0.1:{free_port()}"
    dev = background(
        "dev",
        "--port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
        env={"AGENTLEASE_METRICS_ADDRESS": metrics_address},
    )
    # It says that a worker runs in it, and how to run without one.
    dev.wait_for_line(r"worker:\s+\S+ runs here on queue \S+ and takes its tool calls .*--no-worker", timeout=120)
    dev.wait_for_line(rf"lease metrics:\s+http://{re.escape(metrics_address)}/metrics", timeout=10)
    env = dev_exports(dev)
    dev.wait_for_line("Ctrl-C stops everything", timeout=10)

    done = cli("run", str(RESTOCK_PLAN), "--wait", "--json", "--run-id", "acc-restock", env=env, timeout=120)
    assert done.returncode == 0, done
    run = json.loads(done.stdout)
    assert run["status"] == "completed", done
    assert [task["status"] for task in run["tasks"]] == ["settled"] * len(json.loads(RESTOCK_PLAN.read_text())["steps"])
    shown = cli("status", "acc-restock", "--json", env=env)
    assert shown.returncode == 0, shown
    assert json.loads(shown.stdout) == run

    missing = {"steps": [{"step_id": "fetch", "tool": "http_get", "arguments": {"url": "nope.txt"}}]}
    write_file("missing.json", json.dumps(missing))
    failed = cli("run", "missing.json", "--wait", "--json", "--run-id", "acc-missing", env=env, timeout=120)
    assert_one_error_line(failed, FAILED, "agent run acc-missing waits for a person", "fetch is dead_lettered")
    assert json.loads(failed.stdout)["tasks"][0]["status"] == "dead_lettered", failed
    listed = cli("tasks", "--run", "acc-missing", "--json", env=env)
    assert [task["status"] for task in json.loads(listed.stdout)] == ["dead_lettered"], listed

    assert_one_error_line(cli("status", "no-such-run", env=env), FAILED, "agent run no-such-run")

    # A tool this CLI knows and the dev worker does not: the run fails, and `status` says why.
    write_file("cli_only_tools.py", CLI_ONLY_TOOL)
    write_file("ticket.json", json.dumps({"steps": [{"step_id": "open", "tool": "open_ticket", "arguments": {}}]}))
    cli_only = {**env, "PYTHONPATH": str(cli.cwd), "AGENTLEASE_TOOL_MODULES": "cli_only_tools"}
    unknown = cli("run", "ticket.json", "--wait", "--run-id", "acc-unknown", env=cli_only, timeout=120)
    assert_one_error_line(unknown, FAILED, "agent run acc-unknown failed", "unknown tool(s) open_ticket")
    assert_one_error_line(cli("status", "acc-unknown", env=env), FAILED, "acc-unknown failed", "open_ticket")

    # The worker's lease metrics, as Prometheus scrapes them.
    scraped = lease_metrics(f"http://{metrics_address}/metrics")
    steps = len(json.loads(RESTOCK_PLAN.read_text())["steps"])
    granted = sum(
        v
        for (name, labels), v in scraped.items()
        if name == "agentlease_lease_claims_total" and ("outcome", "granted") in labels
    )
    assert granted >= steps + 1, scraped
    assert scraped[("agentlease_settlements_total", (("outcome", "settled"), ("tool", "sql_upsert")))] >= 1
    assert scraped[("agentlease_tasks_parked_total", (("status", "dead_lettered"), ("tool", "http_get")))] == 1
    assert scraped[("agentlease_settlement_latency_seconds_count", (("tool", "sql_upsert"),))] >= 1

    assert dev.stop(signal.SIGINT) == 0, "".join(dev.stderr)
    assert processes_mentioning(str(cli.data_dir)) == []
    with pytest.raises(httpx.TransportError):  # the metrics endpoint stopped with it
        httpx.get(f"http://{metrics_address}/metrics", timeout=5)


CLI_ONLY_TOOL = """
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass
from agentlease.records import SettlementReceipt


class NoArgs(BaseModel):
    pass


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=5))
async def open_ticket(ctx, args: NoArgs) -> ToolResult:
    return ToolResult(
        receipt=SettlementReceipt(external_system="t", external_id="1", status="ok", verified_at=datetime.now(UTC))
    )
"""


def lease_metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The ``agentlease_*`` samples at ``url``: (name, sorted labels) -> value."""
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    return {
        # One worker: its namespace and task queue labels are left out of the key.
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k not in SCOPE))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("agentlease_")
    }


# -- bad plans -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param('{"steps": [', ("plan.json is not valid JSON", "line 1 column 12"), id="malformed-json"),
        pytest.param(
            '{"steps": [{"step_id": "a", "tool": "teleport", "arguments": {}}]}',
            ("step 0 (a)", "unknown tool 'teleport'", "http_get"),
            id="unknown-tool",
        ),
        pytest.param(
            '{"steps": [{"step_id": "up", "tool": "sql_upsert", "arguments": {"row": {"sku": "A"}}}]}',
            ("step 0 (up)", "sql_upsert", "table: Field required"),
            id="missing-tool-argument",
        ),
        pytest.param(
            '{"steps": [{"step_id": "a", "arguments": {}}]}',
            ("plan.json is invalid", "steps.0.tool: Field required"),
            id="step-without-tool",
        ),
    ],
)
def test_run_refuses_a_bad_plan(cli: Cli, write_file: WriteFile, text: str, fragments: tuple[str, ...]) -> None:
    write_file("plan.json", text)
    # Unreachable Temporal: the plan must be refused before any connection is tried.
    result = cli("run", "plan.json", env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, *fragments)


def test_run_refuses_a_plan_that_is_not_utf8(cli: Cli) -> None:
    (cli.cwd / "plan.json").write_bytes(b'\xff\xfe{"steps": []}')
    result = cli("run", "plan.json", env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "plan.json is not UTF-8")


def test_run_refuses_a_missing_plan_file(cli: Cli) -> None:
    result = cli("run", "no-such-plan.json", env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "cannot read plan no-such-plan.json", "No such file")


# -- unreachable Temporal --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [pytest.param(("run", str(RESTOCK_PLAN)), id="run"), pytest.param(("status", "some-run"), id="status")],
)
def test_unreachable_temporal_fails_fast(cli: Cli, args: tuple[str, ...]) -> None:
    result = cli(*args, env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, FAILED, "cannot reach Temporal at 127.0.0.1:1")
    assert result.elapsed_s < FAIL_FAST_S, result


def test_silent_temporal_fails_fast(cli: Cli) -> None:
    """A frontend that accepts TCP connections but never answers (the SDK alone waits 30s)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        result = cli("status", "some-run", env={"AGENTLEASE_TEMPORAL_ADDRESS": address})
    assert_one_error_line(result, FAILED, f"cannot reach Temporal at {address}", "no answer within")
    assert result.elapsed_s < FAIL_FAST_S + 10, result


# -- bad ledgers -----------------------------------------------------------------------------------

BAD_PG_URLS = [
    pytest.param(
        "postgresql://postgres:s3cret@127.0.0.1:99999/x",
        BAD_INPUT,
        ("bad ledger URL 'postgresql://postgres:***@127.0.0.1:99999/x': port 99999 is not between 1 and 65535",),
        id="port-out-of-range",
    ),
    pytest.param(
        "postgresql://postgres@127.0.0.1:5432/x?sslrootcert=/etc/ca.pem",
        BAD_INPUT,
        ("unsupported option 'sslrootcert'", "supported: sslmode, ssl, connect_timeout, application_name"),
        id="unsupported-option",
    ),
    pytest.param(
        "postgresql://postgres@127.0.0.1:5432/x?sslmode=requre",
        BAD_INPUT,
        ("sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full, not 'requre'",),
        id="bad-sslmode",
    ),
    pytest.param(
        "postgresql://postgres@127.0.0.1:5432/x?connect_timeout=soon",
        BAD_INPUT,
        ("connect_timeout must be a whole number of seconds, at least 1",),
        id="bad-connect-timeout",
    ),
]
"""PostgreSQL URLs refused before any connection (they were a traceback from the driver)."""


@pytest.mark.parametrize(
    ("url", "exit_code", "fragments"),
    [
        pytest.param("notaurl", BAD_INPUT, ("bad ledger URL 'notaurl'", "sqlite:///PATH"), id="not-a-url"),
        pytest.param("mysql://x/y", BAD_INPUT, ("unsupported ledger database 'mysql'",), id="mysql"),
        pytest.param(
            "postgresql://postgres@127.0.0.1:notaport/x", BAD_INPUT, ("bad ledger URL",), id="port-not-a-number"
        ),
        pytest.param(
            "postgresql://postgres@127.0.0.1:1/x",
            FAILED,
            ("ledger postgresql://postgres@127.0.0.1:1/x", "Connect call failed"),
            id="unreachable-postgresql",
        ),
        pytest.param(
            "postgresql://postgres:s3cret@127.0.0.1:1/x", FAILED, ("postgres:***@127.0.0.1:1",), id="password-hidden"
        ),
        pytest.param(
            "sqlite:////proc/no-such-dir/ledger.db",
            FAILED,
            ("no ledger at /proc/no-such-dir",),
            id="sqlite-file-missing",
        ),
        *BAD_PG_URLS,
    ],
)
def test_tasks_refuses_a_bad_ledger_url(cli: Cli, url: str, exit_code: int, fragments: tuple[str, ...]) -> None:
    result = cli("tasks", env={"AGENTLEASE_LEDGER_URL": url})
    line = assert_one_error_line(result, exit_code, *fragments)
    assert "s3cret" not in line
    assert result.elapsed_s < FAIL_FAST_S, result


def test_tasks_on_a_sqlite_ledger_without_schema_hints_at_db_upgrade(cli: Cli) -> None:
    (cli.cwd / "ledger.db").touch()
    result = cli("tasks", env={"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.cwd / 'ledger.db'}"})
    assert_one_error_line(result, FAILED, "no schema yet", "agentlease db upgrade")


def test_reading_a_missing_sqlite_ledger_creates_nothing(cli: Cli) -> None:
    missing = cli.cwd / "elsewhere" / "ledger.db"
    result = cli("tasks", env={"AGENTLEASE_LEDGER_URL": f"sqlite:///{missing}"})
    assert_one_error_line(result, FAILED, f"no ledger at {missing}", "agentlease db upgrade")
    assert not missing.parent.exists()


@pytest.mark.parametrize("command", [("db", "upgrade"), ("sweep", "--once"), ("worker",)])
@pytest.mark.parametrize("url", [p.values[0] for p in BAD_PG_URLS[:2]], ids=["port-out-of-range", "unsupported-option"])
def test_every_ledger_command_refuses_a_bad_postgresql_url(cli: Cli, command: tuple[str, ...], url: str) -> None:
    result = cli(*command, env={"AGENTLEASE_LEDGER_URL": url, **UNREACHABLE_TEMPORAL})
    assert result.returncode == BAD_INPUT, result
    assert "Traceback" not in result.stdout + result.stderr, result
    lines = result.stderr.splitlines()  # a worker names itself first (its banner, its warnings)
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result
    assert lines[-1].startswith("error: bad ledger URL"), result


@pytest.mark.postgres
def test_libpq_options_of_a_postgresql_url_are_used(cli: Cli, pg_ledger_url: str) -> None:
    """``sslmode``, ``connect_timeout`` and ``application_name`` reach the driver under its own names; the test
    server's answer to ``sslmode=require`` (no SSL: refused; SSL: no schema in that database) is one line."""
    ledger = {"AGENTLEASE_LEDGER_URL": f"{pg_ledger_url}?sslmode=disable&connect_timeout=5&application_name=al-test"}
    upgraded = cli("db", "upgrade", env=ledger)
    assert upgraded.returncode == 0, upgraded
    listed = cli("tasks", "--json", env=ledger)
    assert (listed.returncode, json.loads(listed.stdout or "null")) == (0, []), listed
    assert cli("sweep", "--once", env=ledger).returncode == 0

    required = {"AGENTLEASE_LEDGER_URL": f"{pg_ledger_url}_absent?sslmode=require"}
    assert_one_error_line(cli("tasks", env=required), FAILED, "_absent?sslmode=require")


@pytest.mark.postgres
def test_tasks_on_a_missing_postgresql_database_says_so(cli: Cli, pg_ledger_url: str) -> None:
    url = make_url(pg_ledger_url)
    absent = url.set(database=f"{url.database}_absent").render_as_string(hide_password=False)
    result = cli("tasks", env={"AGENTLEASE_LEDGER_URL": absent})
    line = assert_one_error_line(result, FAILED, '_absent" does not exist')
    assert "db upgrade" not in line  # the hint is for a database without tables, not for no database


# -- other bad input -------------------------------------------------------------------------------


def test_events_needs_a_task_or_a_run(cli: Cli) -> None:
    assert_one_error_line(cli("events"), BAD_INPUT, "name a task id or --run")


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("AGENTLEASE_MAX_CONCURRENT_ACTIVITIES", "zero", "AGENTLEASE_MAX_CONCURRENT_ACTIVITIES"),
        ("AGENTLEASE_MAX_CONCURRENT_ACTIVITIES", "0", "greater than or equal to 1"),
        ("AGENTLEASE_SHUTDOWN_GRACE", "soon", "AGENTLEASE_SHUTDOWN_GRACE"),
        ("AGENTLEASE_METRICS_ADDRESS", "9464", "AGENTLEASE_METRICS_ADDRESS: bad metrics address '9464'"),
    ],
)
def test_worker_refuses_a_bad_setting(cli: Cli, variable: str, value: str, fragment: str) -> None:
    result = cli("worker", env={variable: value, **UNREACHABLE_TEMPORAL})
    assert_one_error_line(result, BAD_INPUT, "bad setting", fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("teleport",), "No such command 'teleport'", id="unknown-command"),
        pytest.param(("tasks", "--bogus"), "No such option: --bogus", id="unknown-option"),
        pytest.param(("run",), "Missing argument", id="missing-argument"),
    ],
)
def test_usage_errors_are_one_line(cli: Cli, args: tuple[str, ...], fragment: str) -> None:
    assert_one_error_line(cli(*args), BAD_INPUT, fragment)


# -- db upgrade ------------------------------------------------------------------------------------


def _upgrade_then_list(cli: Cli, url: str) -> None:
    ledger = {"AGENTLEASE_LEDGER_URL": url}
    assert_one_error_line(cli("tasks", env=ledger), FAILED, "agentlease db upgrade")

    upgraded = cli("db", "upgrade", env=ledger)
    assert upgraded.returncode == 0, upgraded
    assert "is at the newest schema" in upgraded.stdout, upgraded
    assert "Traceback" not in upgraded.stdout + upgraded.stderr, upgraded

    again = cli("db", "upgrade", env=ledger)
    assert again.returncode == 0, again

    listed = cli("tasks", "--json", env=ledger)
    assert listed.returncode == 0, listed
    assert json.loads(listed.stdout) == [], listed
    assert listed.stderr == "", listed


def test_db_upgrade_then_tasks_on_sqlite(cli: Cli) -> None:
    _upgrade_then_list(cli, f"sqlite:///{cli.cwd / 'ledger.db'}")


@pytest.mark.postgres
def test_db_upgrade_then_tasks_on_postgresql(cli: Cli, pg_ledger_url: str) -> None:
    _upgrade_then_list(cli, pg_ledger_url)


# -- help ------------------------------------------------------------------------------------------

COMMANDS = ("worker", "run", "status", "tasks", "events", "demo", "dev", "db")
GLOBAL_VARIABLES = (
    "AGENTLEASE_TEMPORAL_ADDRESS",
    "AGENTLEASE_NAMESPACE",
    "AGENTLEASE_TASK_QUEUE",
    "AGENTLEASE_LEDGER_URL",
    "AGENTLEASE_TOOL_MODULES",
    "AGENTLEASE_DATA_DIR",
)


def test_help_lists_commands_and_environment_variables(cli: Cli) -> None:
    result = cli("--help")
    assert result.returncode == 0, result
    assert result.stderr == "", result
    for command in COMMANDS:
        assert re.search(rf"^\W*{command}\s", result.stdout, re.MULTILINE), (command, result)
    for variable in GLOBAL_VARIABLES:
        assert variable in result.stdout, (variable, result)


def test_no_arguments_shows_the_help(cli: Cli) -> None:
    result = cli()
    assert result.returncode == BAD_INPUT, result
    assert "Traceback" not in result.stdout + result.stderr, result
    assert "Usage: agentlease" in result.stdout + result.stderr, result


# -- signals and metrics of the other long-running commands ---------------------------------------


def test_demo_stopped_by_sigterm_stops_everything_it_started(cli: Cli, background: Callable[..., Background]) -> None:
    demo = background("demo")
    paused = demo.wait_for_line(r"plain-worker-a \(pid (\d+)\) started attempt 1", timeout=120)
    demo.wait_for_line(r"paused plain-worker-a \(SIGSTOP\)", timeout=60)
    code = demo.stop(signal.SIGTERM)
    assert code == FAILED, "".join(demo.stderr)
    # The last line says why (tools cancelled mid-call may log their own clean-up before it).
    assert demo.stderr[-1].strip() == "error: stopped by SIGTERM; everything it started is stopped", demo.stderr
    assert processes_mentioning(str(cli.data_dir)) == []
    assert not Path(f"/proc/{paused[1]}").exists()  # the paused worker too: resumed, then stopped


def test_sweeper_serves_its_lease_metrics(cli: Cli, background: Callable[..., Background]) -> None:
    ledger = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.data_dir / 'ledger.db'}"}
    assert cli("db", "upgrade", env=ledger).returncode == 0
    address = f"127.0.0.1:{free_port()}"
    sweeper = background("sweep", "--interval-s", "0.2", env={**ledger, "AGENTLEASE_METRICS_ADDRESS": address})

    def served() -> None:
        try:
            page = httpx.get(f"http://{address}/metrics", timeout=5)
        except httpx.TransportError as exc:
            raise AssertionError(f"not serving yet: {exc}") from None
        assert page.status_code == 200
        assert "# HELP agentlease_leases_expired_total" in page.text

    assert_eventually_sync(served, timeout=30, message="the sweeper serves /metrics")
    assert sweeper.stop(signal.SIGHUP) == 0, "".join(sweeper.stderr)
