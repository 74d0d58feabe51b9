"""The read-only lease timeline page: JSON over plain HTTP, and the page in headless Chromium.

The takeover history is written through the ledger with injected time: generation 1 holds the task
in external_call and goes quiet past its TTL, generation 2 takes over and settles, then generation 1
wakes up and its renewal and its settle are refused.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from agentlease.demo.serving import serve_app
from agentlease.enums import EventKind, SideEffectClass, Stage
from agentlease.errors import LeaseLostError
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from agentlease.ui.app import ui_app
from agentlease.ui.timeline import timeline_page

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("AGENTLEASE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts"))
S = timedelta(seconds=1)


async def takeover(ledger: Ledger) -> TaskSpec:
    run = f"ui-{uuid.uuid4().hex[:8]}"
    spec = TaskSpec(
        task_id=f"{run}/publish",
        agent_run_id=run,
        step_id="publish",
        tool="http_publish",
        side_effect_class=SideEffectClass.FENCED,
        idempotency_key=f"{run}:publish",
        lease_ttl=5 * S,
    )
    base = await ledger.db_now()
    first = await ledger.claim(spec, "worker-a", now=base)
    await ledger.renew(first, reason="POST /posts as generation 1", stage=Stage.EXTERNAL_CALL, now=base + S)
    second = await ledger.claim(spec, "worker-b", now=base + 7 * S)
    await ledger.renew(second, reason="POST /posts as generation 2", stage=Stage.EXTERNAL_CALL, now=base + 8 * S)
    receipt = SettlementReceipt(external_system="publish", external_id="42", status="published", verified_at=base)
    await ledger.settle(second, receipt, now=base + 9 * S)
    for late in (
        ledger.renew(first, reason="woke up", now=base + 10 * S),
        ledger.settle(first, receipt, now=base + 11 * S),
    ):
        with pytest.raises(LeaseLostError):
            await late
    return spec


@pytest.fixture
async def served(ledger: Ledger) -> AsyncIterator[tuple[str, TaskSpec]]:
    spec = await takeover(ledger)
    async with serve_app(ui_app(ledger, temporal_ui="http://127.0.0.1:8233", namespace="default")) as base:
        yield base.rstrip("/"), spec


async def test_the_json_a_script_reads(served: tuple[str, TaskSpec]) -> None:
    base, spec = served
    async with httpx.AsyncClient(base_url=base) as http:
        tasks = (await http.get(f"/api/runs/{spec.agent_run_id}/tasks")).json()
        assert [(t["task_id"], t["status"], t["claim_generation"]) for t in tasks] == [(spec.task_id, "settled", 2)]
        events = (await http.get(f"/api/events/{spec.task_id}")).json()
        assert [e["kind"] for e in events][-2:] == ["lease_lost", "late_unapplied"]
        assert (await http.get("/api/runs/nope/tasks")).status_code == 404
        assert (await http.get("/api/tasks/nope/x")).status_code == 404
        assert (await http.get("/tasks/nope/x")).status_code == 404
        assert (await http.post(f"/api/tasks/{spec.task_id}")).status_code == 405  # read-only


async def test_the_timeline_in_headless_chromium_shows_both_generations_and_the_refused_write(
    served: tuple[str, TaskSpec],
) -> None:
    base, spec = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        try:
            page = await browser.new_page()
            await page.goto(f"{base}/runs/{spec.agent_run_id}")
            await page.click(f"text={spec.step_id}")
            await page.wait_for_selector("svg[aria-label='lease timeline']")
            lanes = await page.locator("text.lane-label").all_text_contents()
            assert lanes == ["generation 1", "generation 2"]
            refused = page.locator(".refused")
            assert await refused.count() == 2
            assert sorted(await refused.evaluate_all("els => els.map(e => e.dataset.kind)")) == [
                "late_unapplied",
                "lease_lost",
            ]
            assert await page.locator("[data-kind='expired'][data-generation='1']").count() == 1
            assert await page.inner_text("#status") == "settled"
            link = await page.get_attribute("a.temporal-ui", "href")
            assert link == f"http://127.0.0.1:8233/namespaces/default/workflows/{spec.agent_run_id}"
            await page.screenshot(path=str(ARTIFACTS / "lease-timeline.png"), full_page=True)
        finally:
            await browser.close()


async def test_the_exported_page_is_self_contained(ledger: Ledger) -> None:
    spec = await takeover(ledger)
    page = timeline_page(await ledger.get_task(spec.task_id), await ledger.events(spec.task_id))
    assert "<script" not in page and "<link" not in page and "src=" not in page  # nothing to fetch
    assert page.count("data-kind='") == len(await ledger.events(spec.task_id))
    assert EventKind.LATE_UNAPPLIED.value in page
