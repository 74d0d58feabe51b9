"""Finding 9 of issue 21: ``agentlease ui`` is safe to run.

- a page of another origin whose host name resolves to 127.0.0.1 (DNS rebinding, played by headless
  Chromium's host resolver rules) gets 421 and none of the ledger;
- beyond loopback it serves only with an operator token, says so in one line, and refuses a
  request without the token (401) or with another host name (421);
- a trail of 200,000 entries is read a page at a time: the timeline page holds 500 entries and a
  link to the next; the JSON lists are bounded by ``?limit=`` and name their next page in ``Link``.

Before: any ``Host`` was answered, every address was served without a word or a token, and the
200,000-entry trail was one 100 MB page.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from playwright.async_api import async_playwright
from sqlalchemy import insert
from sqlalchemy.engine import Connection

from agentlease.demo.serving import serve_app
from agentlease.enums import EventKind, SideEffectClass, Stage
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS
from agentlease.records import SettlementReceipt, TaskSpec
from agentlease.ui.app import EVENTS_PER_PAGE, MAX_LIMIT, TASKS_PER_PAGE, ui_app
from tests.acceptance.conftest import background, cli  # noqa: F401
from tests.acceptance.runner import Background, Cli
from tests.acceptance.test_cli import free_port

pytestmark = pytest.mark.timeout(240)

CHROMIUM = "/usr/bin/chromium"
ENTRIES = 200_000
TOKEN = "an operator token of the test"


def _spec(run: str, step: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:{step}",
        lease_ttl=timedelta(minutes=1),
    )


async def _long_trail(ledger: Ledger) -> TaskSpec:
    """A settled task whose trail holds :data:`ENTRIES` renewals (written in bulk, as a long lease would)."""
    spec = _spec(f"long-{uuid.uuid4().hex[:6]}", "crawl")
    claim = await ledger.claim(spec, "worker-a")
    await ledger.renew(claim, reason="renewal 0", stage=Stage.EXTERNAL_CALL)
    rows = [
        {
            "task_id": spec.task_id,
            "kind": EventKind.RENEWED.value,
            "claim_generation": 1,
            "lease_owner": "worker-a",
            "stage": "external_call",
            "reason": f"renewal {n}",
            "details": None,
            "at_ms": 1_800_000_000_000 + n,
        }
        for n in range(1, ENTRIES)
    ]

    def bulk(conn: Connection) -> None:
        conn.execute(insert(EVENTS), rows)

    await ledger.database.write(bulk)
    receipt = SettlementReceipt(external_system="crawl", external_id="c", status="done", verified_at=claim.acquired_at)
    await ledger.settle(claim, receipt)
    return spec


@pytest.fixture
async def served(ledger: Ledger) -> AsyncIterator[tuple[str, TaskSpec, str]]:
    spec = await _long_trail(ledger)
    wide = f"wide-{uuid.uuid4().hex[:6]}"
    for n in range(TASKS_PER_PAGE + 50):
        await ledger.claim(_spec(wide, f"s{n:04d}"), "worker-a")
    async with serve_app(ui_app(ledger)) as base:
        yield base.rstrip("/"), spec, wide


async def test_pages_and_lists_are_bounded_and_paginated(served: tuple[str, TaskSpec, str]) -> None:
    base, spec, wide = served
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        page = await http.get(f"/tasks/{spec.task_id}")
        assert page.status_code == 200
        assert len(page.content) < 1_000_000, len(page.content)  # it was 100 MB
        assert page.text.count("<tr data-kind=") == EVENTS_PER_PAGE and 'id="next"' in page.text

        events = await http.get(f"/api/events/{spec.task_id}")
        assert len(events.json()) == EVENTS_PER_PAGE
        following = events.headers["link"].split(";")[0].strip("<>")
        more = await http.get(following)
        assert more.json()[0]["event_id"] == events.json()[-1]["event_id"] + 1
        assert len((await http.get(f"/api/events/{spec.task_id}?limit={MAX_LIMIT}")).json()) == MAX_LIMIT
        for bad in ("limit=100000", "limit=0", "limit=x", "after=-1", "after=" + "9" * 30):
            refused = await http.get(f"/api/events/{spec.task_id}?{bad}")
            assert refused.status_code == 400 and refused.json()["error"] == "bad_query", (bad, refused.text)

        tasks = await http.get(f"/api/runs/{wide}/tasks")
        assert len(tasks.json()) == TASKS_PER_PAGE and "link" in tasks.headers
        rest = await http.get(tasks.headers["link"].split(";")[0].strip("<>"))
        assert len(rest.json()) == 50 and "link" not in rest.headers
        run_page = await http.get(f"/runs/{wide}")
        assert run_page.text.count("<tr><td><a href=") == TASKS_PER_PAGE and "id='next'" in run_page.text

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            tab = await browser.new_page()
            await tab.goto(f"{base}/tasks/{spec.task_id}")
            assert await tab.locator("#trail tr[data-kind]").count() == EVENTS_PER_PAGE
            await tab.click("#next")
            await tab.wait_for_selector("#first")
            first_reason = await tab.locator("#trail tr[data-kind] td").nth(6).inner_text()
            assert first_reason == f"renewal {EVENTS_PER_PAGE - 1}", first_reason  # the next entries, in order
        finally:
            await browser.close()


async def test_a_rebinding_page_reads_nothing(served: tuple[str, TaskSpec, str]) -> None:
    base, spec, _ = served
    port = base.rsplit(":", 1)[1]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP rebind.attacker.test 127.0.0.1"],
        )
        try:
            tab = await browser.new_page()
            answer = await tab.goto(f"http://rebind.attacker.test:{port}/tasks/{spec.task_id}")
            assert answer is not None and answer.status == 421
            assert spec.task_id not in await tab.content()
            api = await tab.goto(f"http://rebind.attacker.test:{port}/api/events/{spec.task_id}")
            assert api is not None and api.status == 421
            own = await tab.goto(f"{base}/tasks/{spec.task_id}")  # the operator's own address still works
            assert own is not None and own.status == 200
            assert own.headers["content-security-policy"].startswith("default-src 'none'")
        finally:
            await browser.close()


def test_beyond_loopback_only_with_the_token(cli: Cli, background: object) -> None:  # noqa: F811
    env = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.cwd / 'ledger.db'}", "AGENTLEASE_UI_TOKEN": TOKEN}
    assert cli("db", "upgrade", env=env).returncode == 0
    port = free_port()
    ui: Background = background("ui", "--host", "0.0.0.0", "--port", str(port), env=env)  # type: ignore[operator]
    line = ui.wait_for_line(r"lease timelines on", timeout=30)
    assert line.string.startswith("warning: ") and "beyond this machine" in line.string, line.string
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        assert http.get("/runs/r").status_code == 401
        assert http.get("/runs/r", headers={"Authorization": "Bearer wrong token of the test"}).status_code == 401
        assert http.get("/runs/r", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404  # allowed in
        assert http.get("/runs/r", auth=("operator", TOKEN)).status_code == 404  # a browser's prompt
        elsewhere = http.get("/runs/r", headers={"Authorization": f"Bearer {TOKEN}", "Host": "evil.example"})
        assert elsewhere.status_code == 421
    assert ui.stop() == 0


def test_loopback_by_default(cli: Cli, background: object) -> None:  # noqa: F811
    env = {"AGENTLEASE_LEDGER_URL": f"sqlite:///{cli.cwd / 'ledger.db'}"}
    assert cli("db", "upgrade", env=env).returncode == 0
    port = free_port()
    ui: Background = background("ui", "--port", str(port), env=env)  # type: ignore[operator]
    line = ui.wait_for_line(r"lease timelines on", timeout=30)
    assert line.string.startswith(f"lease timelines on http://127.0.0.1:{port}/"), line.string
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        assert http.get("/runs/r").status_code == 404  # no token needed on loopback
        assert http.get("/runs/r", headers={"Host": "rebind.attacker.test"}).status_code == 421
        for own in {socket.gethostname(), socket.getfqdn()}:  # this machine's names, as documented
            assert http.get("/runs/r", headers={"Host": f"{own.upper()}:{port}"}).status_code == 404, own
    assert ui.stop() == 0


async def test_a_nul_byte_or_a_cursor_past_int64_is_a_bad_query_not_a_500(ledger: Ledger) -> None:
    """PostgreSQL refuses to compare a NUL byte: each of these was a 500 and a traceback in the server's log.
    No id holds one (SQLite finds nothing: not found, or no run with that tool)."""
    await ledger.claim(_spec("r", "s"), "worker-a")
    postgres = ledger.database.dialect == "postgresql"
    paths = [
        "/runs/r%00",
        "/tasks/r%00/s",
        "/api/runs/r%00/tasks",
        "/api/tasks/r%00/s",
        "/api/events/r%00/s",
        "/api/runs/r/tasks?after=1:r%00",
        "/?tool=a%00b",
    ]
    past_int64 = [  # a cursor past the ledger's 64-bit integers: a 500 on SQLite (OverflowError)
        "/api/events/r/s?after=9223372036854775808",
        "/tasks/r/s?after=9999999999999999999",
        "/api/runs/r/tasks?after=9223372036854775808:x",
        "/runs/r?after=9999999999999999999:x",
    ]
    async with serve_app(ui_app(ledger)) as base, httpx.AsyncClient(base_url=base.rstrip("/"), timeout=30) as http:
        for path in paths:
            answer = await http.get(path)
            if postgres:
                assert (answer.status_code, answer.json()["error"]) == (400, "bad_query"), (path, answer.text)
            else:
                assert answer.status_code in (200, 404), (path, answer.text)
        for path in past_int64:
            answer = await http.get(path)
            assert (answer.status_code, answer.json()["error"]) == (400, "bad_query"), (path, answer.text)
