"""``agentlease ui``'s front door and task page in headless Chromium (issue 20, build 2).

A ledger holding a run whose call was taken over and then approved-and-settled beside it, a run
waiting for approval and a dead-lettered run. Before: ``/`` was a 404, the task page's header showed
the generation only, the refused late write was an unlabelled red triangle, the approval an unlabelled
purple square, and the pages needed ``style-src 'unsafe-inline'``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from agentlease.demo.serving import serve_app
from agentlease.enums import DecisionKind, ErrorClass, SideEffectClass
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec
from agentlease.ui.app import ui_app
from tests.integration.test_ui import CHROMIUM, S, takeover

pytestmark = pytest.mark.timeout(120)

MS = timedelta(milliseconds=1)


def _spec(run: str, step: str, tool: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool=tool,
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=f"{run}:{step}",
        lease_ttl=30 * S,
    )


@pytest.fixture
async def stack(ledger: Ledger) -> AsyncIterator[tuple[str, dict[str, TaskSpec]]]:
    taken = await takeover(ledger)
    approved = _spec(taken.agent_run_id, "refund", "send_refund")
    await ledger.decide(approved.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="r", spec=approved)
    await ledger.decide(approved.task_id, DecisionKind.APPROVE, by="alice", reason="ticket OPS-12")
    # The waiting run waits longest (the front page lists the oldest first): its decision 10 ms before the
    # dead letter on the ledger's clock, never the same millisecond (where the run id would decide).
    at = await ledger.db_now()
    waiting = _spec(f"zz-wait-{uuid.uuid4().hex[:6]}", "wire", "send_wire")
    await ledger.decide(
        waiting.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="needs a person", spec=waiting, now=at
    )
    dead = _spec(f"dl-{uuid.uuid4().hex[:6]}", "mail", "send_mail")
    claim = await ledger.claim(dead, "worker-a", now=at + MS)
    await ledger.dead_letter(claim, error_class=ErrorClass.PERMANENT, error="mailbox does not exist", now=at + 10 * MS)
    app = ui_app(ledger, temporal_ui="http://127.0.0.1:8233", namespace="default")
    async with serve_app(app) as base:
        yield base.rstrip("/"), {"taken": taken, "approved": approved, "waiting": waiting, "dead": dead}


async def test_front_door_and_task_page_in_headless_chromium(
    stack: tuple[str, dict[str, TaskSpec]], tmp_path: Path
) -> None:
    base, specs = stack
    async with httpx.AsyncClient(base_url=base) as http:
        css = await http.get("/static/ui.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        csp = css.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
        assert "<style" not in (await http.get("/")).text  # the stylesheet is linked, as the CSP wants
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            blocked: list[str] = []
            page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
            await page.goto(f"{base}/")
            # The waiting run comes first, with the command that decides it.
            waiting = specs["waiting"]
            first = page.locator("#waiting tr.waiting").first
            assert await first.get_attribute("data-run") == waiting.agent_run_id
            commands = await first.locator("code.command").all_text_contents()
            assert any(c.startswith(f"agentlease approve {waiting.agent_run_id} wire") for c in commands), commands
            runs = await page.locator("#runs tr.run").evaluate_all("rows => rows.map(r => r.dataset.run)")
            assert set(runs[:2]) == {waiting.agent_run_id, specs["dead"].agent_run_id}, runs  # both wait for a person
            statuses = await page.locator("#runs tr.run").evaluate_all("rows => rows.map(r => r.dataset.status)")
            assert statuses == ["waiting", "waiting", "running"], statuses  # the approved call is pending
            dead_commands = await page.locator(
                f"#waiting tr[data-run='{specs['dead'].agent_run_id}'] code"
            ).all_text_contents()
            assert any(c.startswith(f"agentlease redrive {specs['dead'].agent_run_id} mail") for c in dead_commands)
            assert await page.locator("meta[http-equiv='refresh']").count() == 1  # a run is under way
            assert await page.eval_on_selector("body", "b => getComputedStyle(b).marginTop") == "24px"  # styled
            shot = tmp_path / "front-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            await page.goto(f"{base}/?status=tasks_final")
            completed = await page.locator("#runs tr.run").evaluate_all("rows => rows.map(r => r.dataset.run)")
            assert waiting.agent_run_id not in completed and specs["dead"].agent_run_id not in completed

            taken = specs["taken"]
            await page.goto(f"{base}/runs/{taken.agent_run_id}")
            assert "approved of refund" in await page.inner_text("#last-decision")
            await page.click(f"text={taken.step_id}")
            await page.wait_for_selector("#generations")
            assert "generation 2" in await page.inner_text("#holder")
            assert "worker-b" in await page.inner_text("#holder")
            owners = await page.locator("#generations td.owner").all_text_contents()
            assert owners == ["worker-a", "worker-b"]
            claimed = await page.locator("#generations td.claimed-at").all_text_contents()
            assert all(c != "-" for c in claimed) and claimed[0] < claimed[1], claimed
            refused = await page.locator("#generations tr[data-gen='1'] td.refused-writes").inner_text()
            assert "refused renew" in refused and "late settle refused" in refused, refused
            labels = await page.locator("text.refused-label").all_text_contents()
            assert sorted(labels) == ["late settle refused", "refused renew"], labels
            assert await page.locator("#legend").count() == 1
            assert await page.locator("text.tick").count() >= 6  # a time axis
            assert await page.locator("circle.ev-renewed").count() == 0  # renewals folded into stage spans
            assert await page.locator("rect.stage-external_call").count() >= 2
            shot = tmp_path / "task-takeover.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")

            await page.goto(f"{base}/tasks/{specs['approved'].task_id}")
            assert "approved by alice" in await page.locator("text.decision-label").all_text_contents()
            assert "alice" in await page.inner_text("#decisions")
            shot = tmp_path / "task-approval.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")

            await page.goto(f"{base}/tasks/{specs['dead'].task_id}")
            assert "dead_lettered" in await page.inner_text("#generations")
            assert blocked == [], blocked  # nothing the CSP had to block
        finally:
            await browser.close()
