"""The low items of issue 21, through the ``agentlease`` console script as a user runs it.

Each was a traceback, a hang or a run retried forever; each is now one ``error:`` line and a non-zero
exit (2 for bad input or configuration, 1 for a failed operation), or a bounded refusal, or one
``warning:`` line where a default is unsafe.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentlease import limits
from agentlease.enums import DecisionKind, SideEffectClass
from agentlease.ledger.grants import LedgerRoles, grant_statements
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.refusals import record_refusal
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec
from agentlease.settings import AgentLeaseSettings
from tests.acceptance.conftest import background, cli, write_file  # noqa: F401
from tests.acceptance.runner import Background, Cli, CliResult, WriteFile
from tests.acceptance.test_cli import BAD_INPUT, FAILED, UNREACHABLE_TEMPORAL, assert_one_error_line

pytestmark = pytest.mark.timeout(180)

BOUNDED_S = 30.0
"""A command that must not hang ends within this."""


def _sqlite(cli: Cli) -> dict[str, str]:  # noqa: F811
    """A migrated SQLite ledger in the working directory."""
    env = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.cwd / 'ledger.db'}"}
    assert cli("db", "upgrade", env=env).returncode == 0
    return env


def _no_traceback(result: CliResult) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result


def test_tasks_since_further_back_than_the_calendar(cli: Cli) -> None:  # noqa: F811
    result = cli("tasks", "--since", "99999999999d", env=_sqlite(cli))
    assert_one_error_line(result, BAD_INPUT, "bad --since", "further back than the calendar goes")


def test_purge_older_than_a_huge_age(cli: Cli) -> None:  # noqa: F811
    result = cli("purge", "--older-than", "99999999999999999999w", env=_sqlite(cli))
    assert_one_error_line(result, BAD_INPUT, "--older-than", "at most 1000 years")


@pytest.mark.parametrize("size", ["32768", "100000"])
def test_purge_batch_size_over_the_bound(cli: Cli, size: str) -> None:  # noqa: F811
    result = cli("purge", "--older-than", "30d", "--batch-size", size, env=_sqlite(cli))
    assert_one_error_line(result, BAD_INPUT, "--batch-size is from 1 to 10000 tasks")


@pytest.mark.postgres
async def test_purge_at_the_largest_batch_on_postgresql(cli: Cli, pg_url: str) -> None:  # noqa: F811
    """The bound is one PostgreSQL takes: a purge at 10,000 tasks per batch purges (it used to say
    "ledger unavailable" above 32,767 and purge nothing)."""
    ledger = Ledger.from_url(pg_url)
    await upgrade(ledger.database)
    for n in range(3):
        run = f"old-{n}"
        spec = _spec(run, "s")
        claim = await ledger.claim(spec, "w")
        await ledger.release(claim, error_class="permanent", error="x")
        await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="t", reason="done")
    conn = await asyncpg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False))
    await conn.execute("UPDATE tasks SET updated_at_ms = updated_at_ms - CAST(86400000 AS bigint) * 40")
    await conn.close()
    await ledger.close()
    result = cli("purge", "--older-than", "30d", "--batch-size", "10000", env={"AGENTLEASE_LEDGER_URL": pg_url})
    assert result.returncode == 0, result
    assert "deleted 3 tasks" in result.stdout, result


def test_ui_on_port_70000(cli: Cli) -> None:  # noqa: F811
    assert_one_error_line(cli("ui", "--port", "70000", env=_sqlite(cli)), BAD_INPUT, "AGENTLEASE_UI_PORT")


def test_ui_beyond_loopback_without_a_token(cli: Cli) -> None:  # noqa: F811
    result = cli("ui", "--host", "0.0.0.0", "--port", "0", env=_sqlite(cli))
    assert_one_error_line(result, BAD_INPUT, "only with AGENTLEASE_UI_TOKEN")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("AGENTLEASE_PLUGINS", "os:path", "bad plugin 'os:path': module, not a temporalio client Plugin"),
        ("AGENTLEASE_PLUGINS", "json:loads", "cannot load plugin 'json:loads': calling it raised TypeError"),
        ("AGENTLEASE_PLUGINS", "no_such_module:x", "cannot load plugin 'no_such_module:x'"),
        (
            "AGENTLEASE_DATA_CONVERTER",
            "os:path",
            "bad data converter 'os:path': module, not a temporalio DataConverter",
        ),
        ("AGENTLEASE_DATA_CONVERTER", "json:loads", "cannot load data converter 'json:loads': calling it raised"),
    ],
)
def test_a_bad_plugin_or_data_converter(cli: Cli, variable: str, value: str, says: str) -> None:  # noqa: F811
    result = cli("status", "some-run", env={**UNREACHABLE_TEMPORAL, variable: value})
    assert_one_error_line(result, BAD_INPUT, says)


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("shared:x", "begins with 'shared:'"),
        ("a/b", "contains '/'"),
        ("..", "is a path segment"),
        (".", "is a path segment"),
        ("invoice\u202etxt.exe", "U+202E, an invisible format character"),
        ("a\u200bb", "U+200B, an invisible format character"),
    ],
)
def test_run_ids_that_would_be_shared_keys_or_paths(cli: Cli, write_file: WriteFile, run_id: str, says: str) -> None:  # noqa: F811
    write_file(
        "plan.json", '{"steps": [{"step_id": "s", "tool": "sql_upsert", "arguments": {"table": "t", "row": {}}}]}'
    )
    result = cli("run", "plan.json", "--run-id", run_id, env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "bad --run-id", says)


def test_a_plan_naming_a_key_twice_is_refused_not_run_with_its_last(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    write_file(
        "plan.json",
        '{"steps": [{"step_id": "s", "tool": "http_get", "tool": "sql_upsert", '
        '"arguments": {"table": "t", "row": {}}}]}',
    )
    result = cli("run", "plan.json", env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "the key 'tool' appears twice in one object")


def test_a_tool_module_that_declares_no_tool_is_refused(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    write_file("notools.py", "TOOLS = 'none here'\n")
    write_file("plan.json", '{"steps": [{"step_id": "s", "tool": "http_get", "arguments": {"url": "http://x"}}]}')
    env = {**UNREACHABLE_TEMPORAL, "PYTHONPATH": str(cli.cwd), "AGENTLEASE_TOOL_MODULES": "notools"}
    assert_one_error_line(cli("run", "plan.json", env=env), BAD_INPUT, "tool module 'notools' declares no tool")


def test_run_on_a_fifo(cli: Cli) -> None:  # noqa: F811
    os.mkfifo(cli.cwd / "plan.json")
    result = cli("run", "plan.json", env=UNREACHABLE_TEMPORAL, timeout=BOUNDED_S)
    assert_one_error_line(result, BAD_INPUT, "cannot read plan plan.json: a FIFO or a socket, not a file")


def test_run_on_a_terminal(cli: Cli) -> None:  # noqa: F811
    """A terminal nobody types into waited forever, as a FIFO did."""
    controller, terminal = os.openpty()
    try:
        name = os.ttyname(terminal)
        result = cli("run", name, env=UNREACHABLE_TEMPORAL, timeout=BOUNDED_S)
        assert_one_error_line(result, BAD_INPUT, f"cannot read plan {name}: a terminal, not a file")
    finally:
        os.close(terminal)
        os.close(controller)


@pytest.mark.parametrize(
    ("key", "refusal"),
    [("fifo", "a FIFO or a socket, not a file"), ("/dev/zero", "larger than"), ("big", "larger than")],
)
def test_an_operator_key_that_is_a_fifo_or_endless_is_refused_at_once(cli: Cli, key: str, refusal: str) -> None:  # noqa: F811
    """A FIFO waited for a writer forever; ``/dev/zero`` or a huge file was read whole into memory."""
    if key == "fifo":
        os.mkfifo(cli.cwd / "op.key")
        key = "op.key"
    elif key == "big":
        (cli.cwd / "op.key").write_bytes(b"agentlease-operator: alice\n" + b"x" * limits.MAX_KEY_FILE_BYTES)
        key = "op.key"
    args = ("--operator-key", key, "approve", "run1", "step1", "--by", "bob", "--reason", "r")
    result = cli(*args, env=UNREACHABLE_TEMPORAL, timeout=BOUNDED_S)
    assert_one_error_line(result, BAD_INPUT, f"AGENTLEASE_OPERATOR_KEY: cannot read {key}: {refusal}")


def _spec(run: str, step: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:{step}",
        lease_ttl=timedelta(seconds=30),
    )


async def test_advise_ttl_with_a_refused_call_record(cli: Cli) -> None:  # noqa: F811
    env = _sqlite(cli)
    ledger = Ledger.from_url(env["AGENTLEASE_LEDGER_URL"])
    await record_refusal(ledger, _spec("attacker", "mail"), "refused: not the scheduling workflow's task")
    await ledger.close()
    result = await asyncio.to_thread(cli, "advise-ttl", env=env)
    assert_one_error_line(result, FAILED, "no renewal history")


def test_worker_with_a_redactor_that_is_no_function(cli: Cli, temporal_address: str) -> None:  # noqa: F811
    env = {**_sqlite(cli), "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address, "AGENTLEASE_REDACTOR": "os:sep"}
    result = cli("worker", env=env, timeout=BOUNDED_S)
    assert result.returncode == BAD_INPUT, result
    _no_traceback(result)
    assert result.stderr.strip().splitlines()[-1] == "error: bad redactor: a function (str) -> str, not str", result


@pytest.mark.postgres
async def test_worker_connected_as_the_reader_role(cli: Cli, temporal_address: str, pg_url: str) -> None:  # noqa: F811
    role = f"agentlease_reader_{uuid.uuid4().hex[:8]}"
    dsn = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn)
    ledger = Ledger.from_url(pg_url)
    try:
        await upgrade(ledger.database)
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        for statement in grant_statements(LedgerRoles(reader=role)):
            await admin.execute(statement)
        reader_url = make_url(pg_url).set(username=role).render_as_string(hide_password=False)
        env = {"AGENTLEASE_LEDGER_URL": reader_url, "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address}
        result = await asyncio.to_thread(cli, "worker", env=env, timeout=BOUNDED_S)
        assert result.returncode == BAD_INPUT, result
        _no_traceback(result)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: the ledger role '{role}' may not do lease operations"), result
    finally:
        await ledger.close()
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


@pytest.mark.postgres
def test_worker_warns_of_the_open_mode_and_a_default_password(
    cli: Cli,  # noqa: F811
    background: object,  # noqa: F811
    temporal_address: str,
    pg_url: str,
) -> None:
    url = make_url(pg_url).set(password="worker").render_as_string(hide_password=False)  # trust: any password
    migrated = cli("db", "upgrade", env={"AGENTLEASE_LEDGER_URL": url})
    assert migrated.returncode == 0, migrated
    env = {"AGENTLEASE_LEDGER_URL": url, "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address}
    worker: Background = background("worker", env=env)  # type: ignore[operator]
    worker.wait_for_line(r"^warning: open decision mode: .* set AGENTLEASE_DECISION_MODE=authenticated", timeout=60)
    worker.wait_for_line(r"^warning: the ledger URL carries a development default password", timeout=10)
    worker.stop()  # (still starting, or serving: either way it ends)


def test_docker_compose_names_its_development_defaults() -> None:
    compose = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    assert "DEVELOPMENT DEFAULTS" in compose
    for variable in ("AGENTLEASE_DECISION_MODE", "AGENTLEASE_CODEC_KEYS", "AGENTLEASE_FENCING_KEY", "_PASSWORD"):
        assert variable in compose, variable


async def test_status_of_an_encrypted_run_without_the_keys(cli: Cli, settings: AgentLeaseSettings) -> None:  # noqa: F811
    from tests.security.test_codec import OLD_KEY, encrypted_run

    settings = settings.model_copy(update={"codec_keys": OLD_KEY})
    async with encrypted_run(settings, f"marker-{uuid.uuid4().hex}") as (_, run_id):
        env = {"AGENTLEASE_TEMPORAL_ADDRESS": settings.temporal_address, "AGENTLEASE_LEDGER_URL": settings.ledger_url}
        result = await asyncio.to_thread(cli, "status", run_id, env=env)
        assert_one_error_line(result, FAILED, f"agent run {run_id}", "encrypted", "AGENTLEASE_CODEC_KEYS")
