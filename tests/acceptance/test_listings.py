"""The ledger's listings from the command line: ``tasks``, ``runs``, ``waiting`` and ``events``.

Run as a user runs them, on a ledger prepared through the ledger's own API: one set of names for
JSON keys and column headers, ``-`` for a task never claimed, the commands that decide a waiting
task in its JSON, filters, a bounded table page, not-found as an error (exit 1), bad input as an
error (exit 2), ``events --follow`` printing entries as they are written, ``postgres://`` URLs.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy.engine import make_url

from agentlease.enums import DecisionKind, ErrorClass, SideEffectClass, Stage
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec

from .runner import Background, Cli
from .test_cli import BAD_INPUT, FAILED, assert_one_error_line

RUN = "shop-42"


def spec(step: str, run: str = RUN) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool="notify",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=f"{run}:{step}",
        lease_ttl=timedelta(minutes=5),
    )


def prepared(url: str) -> None:
    """``shop-42``: ``approve`` waits for approval (never claimed), ``fetch`` holds a lease,
    ``charge`` is dead-lettered; ``done-7``: one settled-free running task."""

    async def prepare() -> None:
        ledger = Ledger.from_url(url)
        try:
            await upgrade(ledger.database)
            gated = spec("approve")
            await ledger.decide(gated.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="x", spec=gated)
            await ledger.claim(spec("fetch"), "worker-1")
            charge = await ledger.claim(spec("charge"), "worker-1")
            await ledger.dead_letter(charge, error_class=ErrorClass.PERMANENT, error="card declined")
            await ledger.claim(spec("s0", run="done-7"), "worker-2")
        finally:
            await ledger.close()

    asyncio.run(prepare())


@pytest.fixture
def ledger_env(cli: Cli) -> dict[str, str]:
    url = f"sqlite:///{cli.cwd / 'ledger.db'}"
    prepared(url)
    return {"AGENTLEASE_LEDGER_URL": url, "COLUMNS": "300"}


def header(table: str) -> list[str]:
    """The column names of the first rich table in ``table``."""
    line = next(line for line in table.splitlines() if "┃" in line)
    return [cell.strip() for cell in line.strip("┃ ").split("┃")]


def row(table: str, first_cell: str) -> list[str]:
    line = next(line for line in table.splitlines() if f"│ {first_cell} " in line)
    return [cell.strip() for cell in line.strip("│ ").split("│")]


def test_tables_are_headed_with_the_json_keys(cli: Cli, ledger_env: dict[str, str]) -> None:
    tasks = cli("tasks", env=ledger_env)
    assert tasks.returncode == 0, tasks
    columns = header(tasks.stdout)
    as_json = json.loads(cli("tasks", "--json", env=ledger_env).stdout)
    assert set(columns) <= set(as_json[0]), (columns, sorted(as_json[0]))
    assert {"claim_generation", "lease_owner"} <= set(columns)

    trail = cli("events", "--run", RUN, env=ledger_env)
    assert trail.returncode == 0, trail
    columns = header(trail.stdout)
    entries = json.loads(cli("events", "--run", RUN, "--json", env=ledger_env).stdout)
    assert set(columns) <= set(entries[0]), (columns, sorted(entries[0]))
    assert {"kind", "claim_generation", "lease_owner", "by"} <= set(columns)
    assert [e["by"] for e in entries if e["kind"] == "awaiting_approval"] == ["agentlease"]


def test_waiting_shows_a_dash_for_a_task_never_claimed_and_its_json_says_what_to_run(
    cli: Cli, ledger_env: dict[str, str]
) -> None:
    table = cli("waiting", env=ledger_env)
    assert table.returncode == 0, table
    columns = header(table.stdout)
    never_claimed = dict(zip(columns, row(table.stdout, f"{RUN}/approve"), strict=True))
    assert never_claimed["claim_generation"] == "-", table
    assert dict(zip(columns, row(table.stdout, f"{RUN}/charge"), strict=True))["claim_generation"] == "1"

    waiting = {t["step_id"]: t for t in json.loads(cli("waiting", "--json", env=ledger_env).stdout)}
    assert set(waiting) == {"approve", "charge"}
    assert f"agentlease approve {RUN} approve --by WHO --reason WHY" in waiting["approve"]["suggested_commands"]
    assert f"agentlease redrive {RUN} charge --by WHO --reason WHY" in waiting["charge"]["suggested_commands"]


def test_filters_and_pages(cli: Cli, ledger_env: dict[str, str]) -> None:
    def steps(*args: str) -> list[str]:
        listed = cli("tasks", *args, "--json", env=ledger_env)
        assert listed.returncode == 0, listed
        return [t["task_id"] for t in json.loads(listed.stdout)]

    # Oldest first, ties (the same millisecond) by task id.
    everything = steps()
    assert sorted(everything) == sorted([f"{RUN}/approve", f"{RUN}/fetch", f"{RUN}/charge", "done-7/s0"])
    assert steps("--status", "running") == [t for t in everything if t in (f"{RUN}/fetch", "done-7/s0")]
    assert set(steps("--status", "running,dead_lettered", "--run", RUN)) == {f"{RUN}/fetch", f"{RUN}/charge"}
    assert steps("--since", "1h") == everything
    assert steps("--since", "2999-01-01T00:00Z") == []
    assert steps("--limit", "2") == everything[:2]
    page = cli("tasks", "--limit", "1", env=ledger_env)
    assert "(first 1 shown; --limit N shows more" in page.stdout, page

    runs = {r["agent_run_id"]: r for r in json.loads(cli("runs", "--json", env=ledger_env).stdout)}
    assert (runs[RUN]["status"], runs[RUN]["tasks"], runs[RUN]["waiting"]) == ("waiting", 3, 2)
    assert runs["done-7"]["status"] == "running"
    waiting_runs = json.loads(cli("runs", "--status", "waiting", "--json", env=ledger_env).stdout)
    assert [r["agent_run_id"] for r in waiting_runs] == [RUN]
    assert header(cli("runs", env=ledger_env).stdout)[:3] == ["agent_run_id", "status", "tasks"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("tasks", "--run", "nope"), "no agent run 'nope' in the ledger", id="tasks-run"),
        pytest.param(("events", "nope/x"), "no task 'nope/x' in the ledger", id="events-task"),
        pytest.param(("events", "--run", "nope"), "no agent run 'nope' in the ledger", id="events-run"),
        pytest.param(("events", "nope/x", "--follow"), "no task 'nope/x' in the ledger", id="events-follow"),
    ],
)
def test_what_the_ledger_does_not_have_is_an_error(
    cli: Cli, ledger_env: dict[str, str], args: tuple[str, ...], fragment: str
) -> None:
    assert_one_error_line(cli(*args, env=ledger_env), FAILED, fragment)


def test_a_run_whose_tasks_are_all_final_is_listed_for_what_the_ledger_knows(cli: Cli) -> None:
    """The ledger holds a run's tool calls, not its workflow: a run whose every task is final may still go on
    (an agent between two calls), so ``runs`` says ``tasks_final``, never ``completed``."""
    url = f"sqlite:///{cli.cwd / 'idle.db'}"

    async def prepare() -> None:
        ledger = Ledger.from_url(url)
        try:
            await upgrade(ledger.database)
            asked = spec("refund", run="idle-3")
            await ledger.decide(asked.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="x", spec=asked)
            await ledger.decide(asked.task_id, DecisionKind.REJECT, by="alice", reason="no")
        finally:
            await ledger.close()

    asyncio.run(prepare())
    env = {"AGENTLEASE_LEDGER_URL": url, "COLUMNS": "300"}
    [run] = json.loads(cli("runs", "--json", env=env).stdout)
    assert (run["agent_run_id"], run["status"], run["final"]) == ("idle-3", "tasks_final", 1), run
    assert [
        r["agent_run_id"] for r in json.loads(cli("runs", "--status", "tasks_final", "--json", env=env).stdout)
    ] == ["idle-3"]
    refused = cli("runs", "--status", "completed", env=env)
    assert_one_error_line(refused, BAD_INPUT, "the ledger knows a run's tool calls, not whether its workflow ended")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("tasks", "--status", "finished"), "bad --status 'finished': one of pending", id="status"),
        pytest.param(("tasks", "--since", "yesterday"), "bad --since 'yesterday'", id="since"),
        pytest.param(("tasks", "--since", "2026-11-30T09:00"), "give the time zone", id="since-naive"),
        pytest.param(("tasks", "--limit", "0"), "bad --limit 0", id="limit"),
        pytest.param(("runs", "--status", "settled"), "bad --status 'settled'", id="runs-status"),
        pytest.param(("events", "--run", RUN, "--follow", "--limit", "5"), "takes no --limit", id="follow-limit"),
    ],
)
def test_bad_input_is_refused_in_one_line(
    cli: Cli, ledger_env: dict[str, str], args: tuple[str, ...], fragment: str
) -> None:
    assert_one_error_line(cli(*args, env=ledger_env), BAD_INPUT, fragment)


def test_events_follow_prints_entries_as_they_are_written(
    cli: Cli, ledger_env: dict[str, str], background: Callable[..., Background]
) -> None:
    follow = background("events", "--run", "done-7", "--follow", "--json", env=ledger_env, stdout=True)
    first = json.loads(follow.wait_for_output_line(r'"kind": "claimed"', timeout=60).string)
    assert (first["task_id"], first["claim_generation"]) == ("done-7/s0", 1)

    async def renew() -> None:
        ledger = Ledger.from_url(ledger_env["AGENTLEASE_LEDGER_URL"])
        try:
            claim = await ledger.claim(spec("s1", run="done-7"), "worker-3")
            await ledger.renew(claim, reason="18 of 24 documents", stage=Stage.EXTERNAL_CALL)
        finally:
            await ledger.close()

    asyncio.run(renew())
    renewed = json.loads(follow.wait_for_output_line(r'"kind": "renewed"', timeout=30).string)
    assert (renewed["task_id"], renewed["reason"]) == ("done-7/s1", "18 of 24 documents")
    assert follow.stop(signal.SIGINT) == 0, "".join(follow.stderr)


@pytest.mark.postgres
def test_a_postgres_url_is_accepted(cli: Cli, pg_ledger_url: str) -> None:
    url = make_url(pg_ledger_url)
    assert url.drivername == "postgresql"
    libpq_style = "postgres://" + pg_ledger_url.split("://", 1)[1]
    env = {"AGENTLEASE_LEDGER_URL": libpq_style}
    assert cli("db", "upgrade", env=env).returncode == 0
    prepared(pg_ledger_url)
    listed = cli("tasks", "--json", env=env)
    assert listed.returncode == 0, listed
    assert len(json.loads(listed.stdout)) == 4
