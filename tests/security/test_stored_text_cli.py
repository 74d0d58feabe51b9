"""Stored text is text in every CLI view (third round): rich markup in what the ledger keeps (a refusal's reason, an
error, a receipt, a model's argument) neither crashes a view (``[/bold]`` used to raise ``MarkupError`` with a
traceback, for the whole ledger) nor turns into a terminal hyperlink (``[link=...]``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentlease.enums import SideEffectClass
from agentlease.ledger.refusals import record_refusal
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec
from tests.acceptance.conftest import cli  # noqa: F401
from tests.acceptance.runner import Cli
from tests.security.test_round2_cli import _sqlite

pytestmark = pytest.mark.timeout(180)

HOSTILE = "refused: [/bold] [link=http://evil.example]click here[/link] [red]x :smile:"


async def test_markup_in_stored_text_is_shown_as_it_is(cli: Cli) -> None:  # noqa: F811
    env = _sqlite(cli)
    ledger = Ledger.from_url(env["AGENTLEASE_LEDGER_URL"])
    spec = TaskSpec(
        task_id="r1/mail",
        agent_run_id="r1",
        step_id="mail",
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key="r1:mail",
        lease_ttl=timedelta(seconds=30),
    )
    await record_refusal(ledger, spec, HOSTILE)
    await ledger.close()
    for command in (("events", "r1/mail"), ("tasks",), ("runs",)):
        shown = await asyncio.to_thread(cli, *command, env={**env, "COLUMNS": "400"})
        assert shown.returncode == 0, (command, shown.stderr)
        assert "Traceback" not in shown.stdout + shown.stderr, shown
        assert "\x1b]8;" not in shown.stdout, command  # no terminal hyperlink
    events = await asyncio.to_thread(cli, "events", "r1/mail", env={**env, "COLUMNS": "400"})
    assert HOSTILE in events.stdout, events.stdout


async def test_a_stored_run_id_is_echoed_escaped_in_a_bulk_decisions_error(
    cli: Cli,  # noqa: F811
    temporal_address: str,
) -> None:
    env = {**_sqlite(cli), "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address}
    ledger = Ledger.from_url(env["AGENTLEASE_LEDGER_URL"])
    run = "a\u202eb"  # written straight to the ledger: plans refuse such a run id
    spec = TaskSpec(
        task_id=f"{run}/mail",
        agent_run_id=run,
        step_id="mail",
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:mail",
        lease_ttl=timedelta(seconds=30),
    )
    await record_refusal(ledger, spec, "refused")
    await ledger.close()
    shown = await asyncio.to_thread(cli, "redrive", "--run", run, "--yes", "--reason", "r", "--by", "me", env=env)
    assert shown.returncode != 0, shown
    assert "Traceback" not in shown.stdout + shown.stderr, shown
    assert "a\\u202eb mail: not decided" in shown.stderr, shown
    assert "\u202e" not in shown.stderr, shown
