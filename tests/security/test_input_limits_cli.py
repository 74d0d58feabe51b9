"""Hostile or merely large input through the ``agentlease`` console script, as a user runs it.

Each case ends in one ``error:`` line and exit code 2 (bad input) or 1 (a failed operation), never a
traceback or a hang (``docs/limits.md``; ``docs/security-input.md``, "Hostile input"). The plan cases
run against an unreachable Temporal: the input is refused before any connection is tried.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from agentlease import limits
from tests.acceptance.conftest import background, cli, write_file  # noqa: F401
from tests.acceptance.runner import Background, Cli, CliResult, WriteFile
from tests.acceptance.test_cli import BAD_INPUT, FAILED, UNREACHABLE_TEMPORAL, assert_one_error_line

pytestmark = pytest.mark.timeout(120)

BOUNDED_S = 30.0
"""Deadline of a CLI run that must not hang (``run /dev/zero``)."""


def _plan(arguments: object = None, **plan: object) -> str:
    """A plan of one ``sql_upsert`` step (its ``row`` takes any JSON object) as text."""
    step = {"step_id": "s", "tool": "sql_upsert", "arguments": arguments or {"table": "t", "row": {"k": 1}}}
    return json.dumps({"steps": [step], **plan})


def _run(cli: Cli, write_file: WriteFile, text: str, *args: str) -> CliResult:  # noqa: F811
    write_file("plan.json", text)
    return cli("run", "plan.json", *args, env=UNREACHABLE_TEMPORAL)


def test_run_id_option_of_300_characters(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    result = _run(cli, write_file, _plan(), "--run-id", "r" * 300)
    assert_one_error_line(result, BAD_INPUT, "bad --run-id", f"at most {limits.MAX_RUN_ID_CHARS} characters")


def test_plan_run_id_whose_key_would_overflow_the_column(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    # 200 + ":" + 128 = 329 characters: more than the ledger's idempotency_key column (256) holds.
    plan = json.loads(_plan(agent_run_id="r" * 200))
    plan["steps"][0]["step_id"] = "s" * 128
    result = _run(cli, write_file, json.dumps(plan))
    assert_one_error_line(result, BAD_INPUT, "agent_run_id: String should have at most 127 characters")


@pytest.mark.parametrize("field", ["agent_run_id", "tool", "idempotency_key"])
def test_nul_in_an_id(cli: Cli, write_file: WriteFile, field: str) -> None:  # noqa: F811
    plan = json.loads(_plan())
    if field == "agent_run_id":
        plan[field] = "run\u0000x"
    else:
        plan["steps"][0][field] = "a\u0000b"
    result = _run(cli, write_file, json.dumps(plan))
    assert_one_error_line(result, BAD_INPUT, "contains a NUL character")


@pytest.mark.parametrize("depth", [500, 3000])
def test_plan_nested_deep(cli: Cli, write_file: WriteFile, depth: int) -> None:  # noqa: F811
    text = _plan().replace('{"k": 1}', '{"k": ' + "[" * depth + "]" * depth + "}")
    result = _run(cli, write_file, text)
    assert_one_error_line(result, BAD_INPUT, "is nested deeper than")


def test_lone_surrogate_in_an_argument(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    text = _plan().replace('{"k": 1}', '{"k": "\\ud800"}')
    result = _run(cli, write_file, text)
    assert_one_error_line(result, BAD_INPUT, "lone surrogate")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity(cli: Cli, write_file: WriteFile, constant: str) -> None:  # noqa: F811
    text = _plan().replace('{"k": 1}', '{"k": ' + constant + "}")
    result = _run(cli, write_file, text)
    assert_one_error_line(result, BAD_INPUT, f"{constant} is not a JSON number")


def test_keep_open_must_be_a_boolean(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    result = _run(cli, write_file, _plan(keep_open="yes"))
    assert_one_error_line(result, BAD_INPUT, "keep_open: Input should be a valid boolean")


def test_run_dev_zero_is_a_bounded_read(cli: Cli) -> None:  # noqa: F811
    result = cli("run", "/dev/zero", env=UNREACHABLE_TEMPORAL, timeout=BOUNDED_S)
    assert_one_error_line(result, BAD_INPUT, f"larger than {limits.MAX_PLAN_BYTES} bytes")


def test_plan_file_too_large(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    big = _plan({"table": "t", "row": {"k": "x" * limits.MAX_PLAN_BYTES}})
    result = _run(cli, write_file, big)
    assert_one_error_line(result, BAD_INPUT, "larger than")


def test_arguments_too_large(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    text = _plan({"table": "t", "row": {"k": "x" * limits.MAX_ARGUMENTS_BYTES}})
    result = _run(cli, write_file, text)
    assert_one_error_line(result, BAD_INPUT, f"more than {limits.MAX_ARGUMENTS_BYTES}")


def test_too_many_steps(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    steps = [
        {"step_id": f"s{i}", "tool": "sql_upsert", "arguments": {"table": "t", "row": {}}}
        for i in range(limits.MAX_STEPS_PER_RUN + 1)
    ]
    result = _run(cli, write_file, json.dumps({"steps": steps}))
    assert_one_error_line(result, BAD_INPUT, f"at most {limits.MAX_STEPS_PER_RUN} items")


def test_empty_task_queue_name(cli: Cli, write_file: WriteFile) -> None:  # noqa: F811
    write_file("plan.json", _plan())
    result = cli("run", "plan.json", env={**UNREACHABLE_TEMPORAL, "AGENTLEASE_TASK_QUEUE": ""})
    assert_one_error_line(result, BAD_INPUT, "bad setting", "AGENTLEASE_TASK_QUEUE")


@pytest.mark.parametrize("address", ["localhost:99999", "localhost", "localhost:http"])
def test_bad_temporal_address(cli: Cli, address: str) -> None:  # noqa: F811
    result = cli("status", "some-run", env={"AGENTLEASE_TEMPORAL_ADDRESS": address})
    assert_one_error_line(result, BAD_INPUT, "bad Temporal address", address)


RECONCILE = ("reconcile", "some-run", "s", "--action", "confirm", "--by", "sam", "--reason", "seen")


@pytest.mark.parametrize("depth", [500, 3000])
def test_observed_nested_deep(cli: Cli, depth: int) -> None:  # noqa: F811
    deep = "[" * depth + "]" * depth
    result = cli(*RECONCILE, "--external-id", "x", "--observed", '{"a": ' + deep + "}", env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "--observed is nested deeper than")


def test_observed_nan(cli: Cli) -> None:  # noqa: F811
    result = cli(*RECONCILE, "--external-id", "x", "--observed", '{"a": NaN}', env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "NaN is not a JSON number")


def test_external_id_too_long(cli: Cli) -> None:  # noqa: F811
    # A command line argument holds at most 128 KiB on Linux; the 2.5 MB case goes through an update.
    result = cli(*RECONCILE, "--external-id", "x" * 100_000, env=UNREACHABLE_TEMPORAL)
    assert_one_error_line(result, BAD_INPUT, "bad decision", f"at most {limits.MAX_EXTERNAL_ID_CHARS} characters")


def test_db_upgrade_of_a_ledger_newer_than_the_code(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    ledger = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}"}
    assert cli("db", "upgrade", env=ledger).returncode == 0
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute("UPDATE alembic_version SET version_num = 'f00dfeed9999'")
    result = cli("db", "upgrade", env=ledger)
    assert_one_error_line(result, FAILED, "f00dfeed9999", "written by a newer agentlease")
    worker = cli("worker", env={**ledger, **UNREACHABLE_TEMPORAL})
    assert worker.returncode == FAILED and "Traceback" not in worker.stderr, worker
    assert worker.stderr.strip().splitlines()[-1].startswith("error: "), worker
    assert "f00dfeed9999" in worker.stderr and "a newer agentlease wrote it" in worker.stderr, worker


def test_unknown_namespace(cli: Cli, write_file: WriteFile, temporal_address: str) -> None:  # noqa: F811
    write_file("plan.json", _plan())
    env = {"AGENTLEASE_TEMPORAL_ADDRESS": temporal_address, "AGENTLEASE_NAMESPACE": "no-such-namespace"}
    assert_one_error_line(cli("status", "some-run", env=env), FAILED, "no-such-namespace", "not found")
    assert_one_error_line(cli("run", "plan.json", env=env), FAILED, "no-such-namespace", "not found")


def test_run_id_of_300_characters_never_starts_a_run(
    cli: Cli,  # noqa: F811
    write_file: WriteFile,  # noqa: F811
    temporal_address: str,
    background: Callable[..., Background],  # noqa: F811
) -> None:
    """With a reachable Temporal the long id used to start a run whose workflow task failed forever."""
    write_file("plan.json", _plan())
    env = {"AGENTLEASE_TEMPORAL_ADDRESS": temporal_address, "AGENTLEASE_TASK_QUEUE": "sec-long-run-id"}
    result = cli("run", "plan.json", "--run-id", "r" * 300, env=env)
    assert_one_error_line(result, BAD_INPUT, "bad --run-id")
    assert "started" not in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("status", "a\u202eb"), id="status"),
        pytest.param(("status", "run", "a\u202eb"), id="usage-error"),
        pytest.param(("a\u202eb",), id="unknown-command"),
    ],
)
def test_a_bidi_override_in_an_echoed_id_is_escaped(cli: Cli, temporal_address: str, args: tuple[str, ...]) -> None:  # noqa: F811
    result = cli(*args, env={"AGENTLEASE_TEMPORAL_ADDRESS": temporal_address})
    assert_one_error_line(result, result.returncode, "a\\u202eb")
    assert result.returncode in (BAD_INPUT, FAILED), result
    assert "\u202e" not in result.stderr, result


def test_a_setting_out_of_range_names_its_variable(cli: Cli) -> None:  # noqa: F811
    result = cli("tasks", env={"AGENTLEASE_APPROVAL_TTL": "1e12"})
    assert_one_error_line(result, BAD_INPUT, "bad setting: AGENTLEASE_APPROVAL_TTL", "less than or equal to 30 days")
