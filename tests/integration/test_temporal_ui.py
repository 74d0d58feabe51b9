"""The Temporal UI tells the lease: the workflow page in headless Chromium on a dev server with its UI.

While a call runs, the run's page shows its current details (stage, generation, renewal reason,
owner), its search attributes (``AgentLeaseStage``, ``AgentLeaseGeneration``) and the activity's
summary (``step: tool``). An operator approves a waiting step from the page's "Send an Update"
dialog: a decision the step does not allow is refused in the dialog by the run's validator, the
right one is made, and the last decision is then on the page without expanding any event.
Screenshots are kept in ``.test-artifacts/`` (``AGENTLEASE_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright, expect
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.demo.downstream import bind_loopback
from agentlease.records import RunStatus
from agentlease.runtime.devserver import dev_server
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger
from tests.integration.test_ui import ARTIFACTS, CHROMIUM

pytestmark = pytest.mark.timeout(240)


async def tab_shows(page: Page, tab: str, *texts: str, framed: bool = False) -> None:
    """One tab of the workflow page, freshly loaded, shows each of ``texts`` (waited for, 10 s at most each).

    ``framed``: the texts are in the tab's frame (the UI renders current details as Markdown in an iframe).

    Raises:
        AssertionError: it does not (callers poll: a reload shows what the run has shown since).
    """
    await page.reload()
    await (
        page.get_by_role("link", name=tab, exact=True).or_(page.get_by_role("tab", name=tab, exact=True)).first.click()
    )
    shown = page.frame_locator("main iframe").locator("body") if framed else page.locator("main")
    for text in texts:
        await expect(shown).to_contain_text(text, timeout=10_000)


async def send_update(page: Page, name: str, payload: dict[str, str]) -> None:
    """Fill in and submit the page's "Send an Update" dialog (it stays open until the update answers)."""
    await page.get_by_role("button", name="More Actions").click()
    await page.get_by_role("menuitem", name="Send an Update").first.click()
    dialog = page.locator("dialog[open]")
    await dialog.get_by_test_id("update-select-button").click()
    await page.get_by_role("option", name=name, exact=True).click()
    await dialog.locator(".cm-content").click()
    await page.keyboard.press("Control+A")  # the dialog keeps what was typed before a Cancel
    await page.keyboard.press("Backspace")
    await page.keyboard.type(json.dumps(payload))  # the editor closes brackets and quotes: typed over
    # Leaving the editor hands its text to the dialog; a new update id, as an operator would ask for.
    await dialog.get_by_role("button", name="Random UUID").click()
    await dialog.get_by_role("button", name="Submit").click()
    await page.screenshot(path=str(ARTIFACTS / f"temporal-ui-update-{name}-{payload['step_id']}.png"))


@pytest.fixture
async def ui_settings(settings: AgentLeaseSettings, tmp_path: Path) -> AsyncIterator[tuple[AgentLeaseSettings, str]]:
    """A dev server of this test's own that serves the Temporal UI; settings aimed at it, and the UI's URL."""
    with bind_loopback() as probe:
        ui_port = probe.getsockname()[1]
    async with dev_server(tmp_path / "temporal", ui_port=ui_port) as env:
        address = env.client.service_client.config.target_host
        yield settings.model_copy(update={"temporal_address": address}), f"http://127.0.0.1:{ui_port}"


async def test_the_workflow_page_tells_the_lease_and_takes_an_approval(
    ui_settings: tuple[AgentLeaseSettings, str],
) -> None:
    settings, ui = ui_settings
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run_id = f"tui-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, ("hold", "gated", {}), ("send", "send_once", {"hold_first_attempt": False}))
    client = await Client.connect(settings.temporal_address, data_converter=pydantic_data_converter)
    async with (
        opened_ledger(settings) as ledger,
        _worker(client, ledger, settings, "worker-ui"),
        async_playwright() as pw,
    ):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        try:
            page = await browser.new_page(viewport={"width": 1600, "height": 1200})
            await page.goto(f"{ui}/namespaces/default/workflows/{run_id}")

            async def details_show_the_live_lease() -> None:
                await tab_shows(
                    page, "User Metadata", "hold: preflight, generation 1, renewing: ", "(worker-ui)", framed=True
                )

            await assert_eventually(details_show_the_live_lease, timeout=60, interval=1, message="current details")
            await page.screenshot(path=str(ARTIFACTS / "temporal-ui-current-details.png"), full_page=True)

            async def attributes_show_the_live_lease() -> None:
                await tab_shows(
                    page,
                    "Search Attributes",
                    '"AgentLeaseStage": "preflight"',
                    '"AgentLeaseGeneration": 1',
                    '"AgentLeaseOwner": "worker-ui"',
                )

            await assert_eventually(attributes_show_the_live_lease, timeout=60, interval=1, message="search attributes")
            await page.screenshot(path=str(ARTIFACTS / "temporal-ui-search-attributes.png"), full_page=True)

            async def summary_on_the_timeline() -> None:
                await tab_shows(page, "Timeline", "hold: gated")  # the activity's summary

            await assert_eventually(summary_on_the_timeline, timeout=60, interval=1, message="activity summary")

            tools.gate(f"{run_id}/hold").set()

            async def send_waits() -> None:
                status = await handle.query(STATUS_QUERY, result_type=RunStatus)
                assert [t.status.value for t in status.tasks] == ["settled", "awaiting_approval"], status

            await assert_eventually(send_waits, timeout=60, message="send waits for approval")
            await page.reload()
            await send_update(page, "approve", {"step_id": "hold", "by": "alice", "reason": "wrong step"})
            dialog = page.locator("dialog[open]")
            await dialog.get_by_text("cannot approve step 'hold': it is settled, not awaiting_approval").wait_for()
            await page.screenshot(path=str(ARTIFACTS / "temporal-ui-update-refused.png"))
            await dialog.get_by_test_id("cancel-modal-button").click()

            await send_update(page, "approve", {"step_id": "send", "by": "alice", "reason": "ticket OPS-12"})
            await page.locator("dialog[open]").wait_for(state="detached")
            result = await handle.result()
            assert [t.status.value for t in result.tasks] == ["settled", "settled"]

            async def decision_on_the_page() -> None:
                # Who approved and why are in the evidence trail: the run's view carries no free text.
                await tab_shows(page, "User Metadata", "last decision: send: approved", framed=True)

            await assert_eventually(decision_on_the_page, timeout=60, interval=1, message="last decision")
            await page.screenshot(path=str(ARTIFACTS / "temporal-ui-last-decision.png"), full_page=True)

            async def decision_attribute() -> None:
                await tab_shows(page, "Search Attributes", '"AgentLeaseDecision": "send: approved"')

            await assert_eventually(decision_attribute, timeout=60, interval=1, message="decision attribute")
        finally:
            await browser.close()
