"""The operator console (``agentlease ui``) in headless Chromium over a stack that real workers made.

Everything the pages show was written by ``agentlease worker`` processes on a Temporal dev server and a
PostgreSQL ledger, driven through the command line (:mod:`tests.acceptance.ui_stack_tools`):

- a takeover: ``worker-a`` (one activity slot) claims a fenced write and holds it in ``external_call``;
  the test pauses it (SIGSTOP), ``worker-b`` takes over with the next generation and settles, then
  ``worker-a`` is resumed: its renewal and its settle are refused;
- a run waiting for an operator's approval, and one approved (``agentlease approve --by alice``) that settled;
- a dead-lettered run (a permanent failure).

Then ``agentlease ui`` runs as a subprocess and headless Chromium checks: the front page lists the
waiting run first with the call's arguments, their fingerprint and its decision command; the taken-over
call's page shows every generation with its owner and claim time and the refused late writes labelled;
the approval says who approved. Screenshots are kept in ``.test-artifacts/ui-real-stack/``
(``AGENTLEASE_TEST_ARTIFACTS``).

Robust on a loaded machine: nothing depends on a lease surviving CPU starvation. Generation 1 holds
through refused renewals until the test releases it, so an early takeover changes nothing; a later
generation may follow the second (its owner is then ``worker-b`` too); every wait polls.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, async_playwright
from temporalio.client import Client

from agentlease.enums import EventKind, TaskStatus
from agentlease.errors import TaskNotFoundError
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent, TaskRecord, arguments_fingerprint
from tests.acceptance.fleet import REPO, Fleet, wait_polling
from tests.acceptance.ui_stack_tools import HOLDING
from tests.eventually import assert_eventually

from .runner import Background, Cli
from .test_cli import free_port

pytestmark = pytest.mark.timeout(240)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(
    os.environ.get("AGENTLEASE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts")
) / ("ui-real-stack")

START_S = 90.0
"""Deadline for a worker to come up (a worker start costs about 2 s of CPU; more on a loaded machine)."""

WIRE_WAIT = {"account": "ACME-1", "amount": 900}
"""The arguments of the wire that waits for approval."""

SETTLE_S = 90.0
"""Deadline for a call to reach the state the test waits for (a takeover: lease TTL, retry, a worker start)."""


def _facts(events: list[LeaseEvent]) -> str:
    return "\n".join(f"{e.kind.value} gen {e.claim_generation} {e.lease_owner} {e.reason}" for e in events)


async def test_operator_console_over_a_stack_made_by_real_workers(
    cli: Cli, background: Callable[..., Background], pg_ledger_url: str, temporal_address: str, tmp_path: Path
) -> None:
    queue = f"ui-stack-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    runs = {name: f"{name}-{tag}" for name in ("note", "wire-wait", "wire-ok", "mail")}
    env = {
        "PYTHONPATH": str(REPO),
        "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
        "AGENTLEASE_TASK_QUEUE": queue,
        "AGENTLEASE_LEDGER_URL": pg_ledger_url,
        "AGENTLEASE_TOOL_MODULES": "tests.acceptance.ui_stack_tools",
    }
    upgraded = cli("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded
    resume = tmp_path / "resume-worker-a"

    def start_run(name: str, tool: str, step: str, arguments: dict[str, Any]) -> None:
        plan = cli.cwd / f"{name}.json"
        plan.write_text(json.dumps({"steps": [{"step_id": step, "tool": tool, "arguments": arguments}]}))
        started = cli("run", str(plan), "--run-id", runs[name], env=env)
        assert started.returncode == 0, started

    fleet = Fleet(temporal_address, pg_ledger_url, cli, tool_modules="tests.acceptance.ui_stack_tools")
    ledger = Ledger.from_url(pg_ledger_url)
    client = await Client.connect(temporal_address)
    try:
        # worker-a, alone, claims the write (generation 1) and holds it in external_call.
        first = fleet.start(queue, "worker-a", slots=1)
        await wait_polling(client, queue, first, timeout=START_S)
        start_run("note", "ui_write_note", "write", {"target": f"note-{tag}", "resume_file": str(resume)})
        note = f"{runs['note']}/write"

        async def holding() -> None:
            events = await ledger.events(note)
            held = [e for e in events if e.kind is EventKind.RENEWED and (e.reason or "").startswith(HOLDING)]
            assert held and held[-1].lease_owner == "worker-a", _facts(events)

        await assert_eventually(holding, timeout=START_S, interval=0.2, message="worker-a holds the write")

        # Paused; worker-b takes over once the lease has lapsed, and settles.
        first.signal(signal.SIGSTOP)
        fleet.start(queue, "worker-b")

        async def taken_over() -> TaskRecord:
            task = await ledger.get_task(note)
            assert (task.status, task.lease_owner) == (TaskStatus.SETTLED, "worker-b"), task
            assert task.claim_generation >= 2, task
            return task

        await assert_eventually(taken_over, timeout=SETTLE_S, interval=0.2, message="worker-b took over and settled")

        # Resumed and released: generation 1's renewal and settle are refused.
        resume.touch()
        first.signal(signal.SIGCONT)

        async def refused_late() -> None:
            events = await ledger.events(note)
            late = {e.kind for e in events if e.claim_generation == 1}
            assert {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED} <= late, _facts(events)

        await assert_eventually(refused_late, timeout=SETTLE_S, interval=0.2, message="generation 1's late writes")

        # A run waiting for approval, one approved by alice, one dead-lettered: in this order in the ledger.
        async def status_of(task_id: str, wanted: TaskStatus) -> None:
            try:
                task = await ledger.get_task(task_id)
            except TaskNotFoundError:
                raise AssertionError(f"no task {task_id} yet") from None
            assert task.status is wanted, task

        start_run("wire-wait", "ui_send_wire", "wire", WIRE_WAIT)
        waiting = f"{runs['wire-wait']}/wire"
        await assert_eventually(lambda: status_of(waiting, TaskStatus.AWAITING_APPROVAL), timeout=SETTLE_S)
        start_run("wire-ok", "ui_send_wire", "pay", {"account": "ACME-2", "amount": 12})
        approved = f"{runs['wire-ok']}/pay"
        await assert_eventually(lambda: status_of(approved, TaskStatus.AWAITING_APPROVAL), timeout=SETTLE_S)
        decided = cli("approve", runs["wire-ok"], "pay", "--by", "alice", "--reason", "ticket OPS-12", env=env)
        assert decided.returncode == 0, decided
        start_run("mail", "ui_send_mail", "mail", {"to": f"nobody-{tag}@example.com"})
        dead = f"{runs['mail']}/mail"
        await assert_eventually(lambda: status_of(dead, TaskStatus.DEAD_LETTERED), timeout=SETTLE_S)
        await assert_eventually(lambda: status_of(approved, TaskStatus.SETTLED), timeout=SETTLE_S)

        port = free_port()
        ui = background(
            "ui",
            "--port",
            str(port),
            "--temporal-ui",
            "http://127.0.0.1:8233",
            env={"AGENTLEASE_LEDGER_URL": pg_ledger_url},
        )
        ui.wait_for_line("lease timelines on", timeout=60)
        base = f"http://127.0.0.1:{port}"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                await front_page(page, base, runs)
                await takeover_page(page, base, note)
                await approval_page(page, base, approved)
                await page.goto(f"{base}/tasks/{dead}")
                assert "dead_lettered" in await page.inner_text("#generations")
                # the attempt that failed let go of the row's owner: the page names it from the trail
                [owner] = await page.locator("#generations td.owner").all_text_contents()
                assert owner in ("worker-a", "worker-b"), owner
                assert f"last held by {owner} (claimed 20" in await page.inner_text("#holder")
                await page.screenshot(path=str(ARTIFACTS / "task-dead-lettered.png"), full_page=True)
            finally:
                await browser.close()
        print(f"screenshots: {ARTIFACTS}")
    finally:
        await fleet.stop_all()
        await ledger.close()


async def _read(page: Page, script: str) -> Any:
    """``script`` evaluated in the page, again if the page reloaded meanwhile (it refreshes every 5 s)."""

    async def once() -> Any:
        try:
            return await page.evaluate(script)
        except PlaywrightError as exc:  # the execution context went away with a reload
            raise AssertionError(str(exc)) from None

    return await assert_eventually(once, timeout=30, interval=0.2, message="the page read")


FRONT = """() => ({
    waiting: [...document.querySelectorAll('#waiting tr.waiting')].map(r => ({
        run: r.dataset.run, commands: [...r.querySelectorAll('code.command')].map(c => c.textContent),
        arguments: [...r.querySelectorAll('td.request span.argument')].map(a => a.textContent),
        sha256: r.querySelector('td.request code.sha256')?.textContent})),
    runs: [...document.querySelectorAll('#runs tr.run')].map(r => [r.dataset.run, r.dataset.status]),
})"""


async def front_page(page: Page, base: str, runs: dict[str, str]) -> None:
    await page.goto(f"{base}/")
    shown = await _read(page, FRONT)
    first = shown["waiting"][0]
    assert first["run"] == runs["wire-wait"], shown  # the run waiting for a person comes first
    # the approver sees the call: its arguments and their fingerprint, which the approve command names
    fingerprint = arguments_fingerprint(WIRE_WAIT)
    assert sorted(first["arguments"]) == ["account: ACME-1", "amount: 900"] and first["sha256"] == fingerprint, shown
    approve = f"agentlease approve {runs['wire-wait']} wire --arguments-sha256 {fingerprint}"
    assert any(c.startswith(approve) for c in first["commands"]), shown
    dead = [w for w in shown["waiting"] if w["run"] == runs["mail"]]
    assert dead and any(c.startswith(f"agentlease redrive {runs['mail']} mail") for c in dead[0]["commands"]), shown
    statuses = dict(shown["runs"])
    assert {run for run, _ in shown["runs"][:2]} == {runs["wire-wait"], runs["mail"]}, shown  # both wait, first
    assert (statuses[runs["note"]], statuses[runs["wire-ok"]]) == ("tasks_final", "tasks_final"), shown
    await page.screenshot(path=str(ARTIFACTS / "front-page.png"), full_page=True)


GENERATIONS = """() => [...document.querySelectorAll('#generations tr[data-gen]')].map(r => ({
    gen: Number(r.dataset.gen), owner: r.querySelector('td.owner').textContent,
    claimed: r.querySelector('td.claimed-at').textContent, refused: r.querySelector('td.refused-writes').textContent,
}))"""


async def takeover_page(page: Page, base: str, task_id: str) -> None:
    await page.goto(f"{base}/tasks/{task_id}")
    rows = await _read(page, GENERATIONS)
    assert len(rows) >= 2 and rows[0]["gen"] == 1, rows
    assert rows[0]["owner"] == "worker-a" and all(r["owner"] == "worker-b" for r in rows[1:]), rows
    claimed = [r["claimed"] for r in rows]
    assert all(c != "-" for c in claimed) and claimed == sorted(claimed), rows
    assert "refused renew" in rows[0]["refused"] and "late settle refused" in rows[0]["refused"], rows
    labels = set(await page.locator("text.refused-label").all_text_contents())
    assert {"refused renew", "late settle refused"} <= labels, labels
    holder = await page.inner_text("#holder")
    assert "worker-b" in holder and f"generation {rows[-1]['gen']}" in holder, holder
    await page.screenshot(path=str(ARTIFACTS / "task-takeover.png"), full_page=True)


async def approval_page(page: Page, base: str, task_id: str) -> None:
    await page.goto(f"{base}/tasks/{task_id}")
    assert "approved by alice" in await page.locator("text.decision-label").all_text_contents()
    approvals = await page.locator("#decisions tr[data-decision='approved'] td.by").all_text_contents()
    assert approvals == ["alice"], approvals
    await page.screenshot(path=str(ARTIFACTS / "task-approval.png"), full_page=True)
