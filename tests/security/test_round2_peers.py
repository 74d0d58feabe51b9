"""The low items of issue 21 that a peer reaches over the network or through a tool: the codec server's
body, the middleware's callers and slow bodies, forged fencing tokens, tools' secret names and the
settings view, float arguments, and what ``purge`` may delete.

Each runs against real parts: ``agentlease codec-server`` as a process, the middleware in a uvicorn
server, a worker on the dev server, SQLite and PostgreSQL ledgers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import uuid
from datetime import datetime, timedelta

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from agentlease.demo.serving import serve_app
from agentlease.enums import DecisionKind, ErrorClass, SideEffectClass, TaskStatus
from agentlease.errors import InvalidFencingTokenError, PermanentToolError
from agentlease.fencing import sign_fencing_token, verify_fencing_token
from agentlease.ledger.retention import purge
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, SettlementReceipt, TaskSpec
from agentlease.runtime.temporal import connect
from agentlease.security.codec import ENCODING, KEY_ID
from agentlease.security.codec_server import MAX_BODY_BYTES, codec_app
from agentlease.security.secrets import EnvSecretProvider, SecretNameError, ToolSecrets, ToolSettings
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.conftest import background, cli  # noqa: F401
from tests.acceptance.runner import Background, Cli
from tests.acceptance.test_cli import free_port
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.security.test_codec import OLD_KEY
from tests.security.test_middleware import KEY, service

pytestmark = pytest.mark.timeout(180)


# -- the codec server ---------------------------------------------------------------------------------


@pytest.fixture
def codec_server(cli: Cli, background: object) -> str:  # noqa: F811
    """``agentlease codec-server`` on a free loopback port; its base URL."""
    port = free_port()
    server: Background = background(  # type: ignore[operator]
        "codec-server", "--port", str(port), env={"AGENTLEASE_CODEC_KEYS": OLD_KEY}
    )
    server.wait_for_line(r"^codec server on http://127\.0\.0\.1:\d+", timeout=30)
    return f"http://127.0.0.1:{port}"


def _sealed(data: bytes, key_id: bytes = b"k1") -> str:
    payload = Payload(metadata={"encoding": ENCODING, KEY_ID: key_id}, data=data)
    return json_format.MessageToJson(Payloads(payloads=[payload]))


async def test_the_codec_server_answers_a_one_byte_ciphertext_400(codec_server: str) -> None:
    async with httpx.AsyncClient(base_url=codec_server, timeout=10) as http:
        for data in (b"x", b"\x00" * 27):  # shorter than a nonce and a tag
            answer = await http.post("/decode", content=_sealed(data), headers={"content-type": "application/json"})
            assert answer.status_code == 400, answer.text
            assert "not a sealed payload" in answer.json()["message"]


def _raw_request(port: int, head: bytes, body_chunks: int, chunk: bytes) -> bytes:
    """Send ``head`` and up to ``body_chunks`` chunks of a chunked body (never its end), then read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head)
        try:
            for _ in range(body_chunks):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server answered and closed while the client was still sending
        return _read_answer(sock)


def _read_answer(sock: socket.socket) -> bytes:
    """Read one HTTP answer: its head, then as much body as it announces (or until the server closes)."""
    answer = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not part:
            return answer
        answer += part
        head, sep, body = answer.partition(b"\r\n\r\n")
        if not sep:
            continue
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ),
            None,
        )
        if length is None or len(body) >= length:
            return answer


async def test_the_codec_server_stops_reading_at_8_mib(codec_server: str) -> None:
    port = int(codec_server.rsplit(":", 1)[1])
    announced = (
        b"POST /decode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 419430400\r\n\r\n"
    )
    answer = await asyncio.to_thread(_raw_request, port, announced, 0, b"")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # No length announced: it reads chunk by chunk and answers 413 past 8 MiB, while the client still sends.
    chunked = (
        b"POST /decode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = MAX_BODY_BYTES // 65536 + 64  # 12 MiB offered, never finished
    answer = await asyncio.to_thread(_raw_request, port, chunked, chunks, b"x" * 65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_the_codec_server_drops_a_client_that_never_finishes_its_headers(codec_server: str) -> None:
    port = int(codec_server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /decode HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert sock.recv(1024) == b""  # closed by the server (HEADER_TIMEOUT), not held forever


async def test_a_body_slower_than_its_deadline_is_408() -> None:
    from agentlease.security.codec import EncryptionCodec

    app = codec_app(EncryptionCodec.from_text(OLD_KEY), body_timeout=timedelta(seconds=1))
    async with serve_app(app) as base:
        port = int(base.rstrip("/").rsplit(":", 1)[1])
        head = b"POST /decode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
        answer = await asyncio.to_thread(_raw_request, port, head, 0, b"")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


# -- the middleware -----------------------------------------------------------------------------------


async def test_the_auth_scheme_does_not_make_another_caller(ledger_url: str) -> None:
    async with service(ledger_url) as (client, _engine):
        first = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer x"})
        again = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "bearer x"})
        spaced = await client.post(
            "/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "BEARER   x"}
        )
        other = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer X"})
    assert first.status_code == 201
    for replay in (again, spaced):
        assert replay.headers.get("idempotent-replayed") == "true" and replay.json() == first.json()
    assert other.status_code == 201 and other.json() != first.json()  # credentials compare exactly


async def test_the_middleware_answers_a_trickling_body_408(ledger_url: str) -> None:
    async with service(ledger_url, body_timeout_s=1.0) as (client, _engine):
        port = int(str(client.base_url).rstrip("/").rsplit(":", 1)[1])
        head = (
            b"POST /articles/1 HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: slow\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        answer = await asyncio.to_thread(_raw_request, port, head, 0, b"")
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"request_timeout" in answer
        # The key was never claimed: the same key with a whole body runs.
        done = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "slow"})
        assert done.status_code == 201


# -- fencing tokens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["².abc", "1.é", "1.\u0661\u0662", "\u0663.abc", "٣٣.x"])
def test_a_forged_fencing_token_is_refused_not_raised(token: str) -> None:
    with pytest.raises(InvalidFencingTokenError):
        verify_fencing_token(KEY, "/articles/1", token)


async def test_the_middleware_refuses_a_non_ascii_token_with_400(ledger_url: str) -> None:
    async with service(ledger_url, fencing_key=KEY, require_fencing_token=True) as (client, _engine):
        good = sign_fencing_token(KEY, "/articles/1", 1)
        forged = good.split(".")[0] + ".é" + good.split(".")[1][1:]
        for token in (forged, "²." + good.split(".")[1]):
            answer = await client.post(
                "/articles/1",
                json={},
                headers=[
                    (b"Idempotency-Key", f"k-{uuid.uuid4().hex}".encode()),
                    (b"Fencing-Token", token.encode("latin-1")),
                ],
            )
            assert answer.status_code == 400 and answer.json()["error"] == "invalid_fencing_token", answer.text


# -- tools' secrets and settings ----------------------------------------------------------------------


def test_two_tools_never_share_a_secret_variable() -> None:
    first = EnvSecretProvider.variable("http", "get_api_token")
    second = EnvSecretProvider.variable("http_get", "api_token")
    assert first != second, first
    env = {first: "for-http", second: "for-http-get"}
    assert ToolSecrets(EnvSecretProvider(env), "http").get("get_api_token") == "for-http"
    assert ToolSecrets(EnvSecretProvider(env), "http_get").get("api_token") == "for-http-get"
    for bad in ("api__token", "_token", "token_", "api-token", ""):
        with pytest.raises(SecretNameError):
            ToolSecrets(EnvSecretProvider(env), "http").get(bad)


def test_the_settings_view_holds_nothing_it_does_not_show() -> None:
    settings = AgentLeaseSettings(ledger_url="postgresql://u:ledger-pw-77@db/l", smtp_port=2525)
    for declared in (None, ("smtp_port",)):
        view = ToolSettings(settings, "mailer", declared)
        assert view.smtp_port == 2525
        with pytest.raises(AttributeError):
            view._settings  # noqa: B018 - the bypass of issue 21
        held = [getattr(view, slot) for slot in type(view).__slots__]
        assert "ledger-pw-77" not in repr(held), held


@pytest.mark.postgres
async def test_a_tool_cannot_step_around_its_settings_view(settings: AgentLeaseSettings, pg_url: str) -> None:
    ledger_url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:ledger-pw-77@")
    settings = settings.model_copy(update={"ledger_url": ledger_url})
    client = await connect(settings)
    run_id = f"bypass-{uuid.uuid4().hex[:8]}"
    step = PlanStep(step_id="peek", tool="read_setting", arguments={"name": "_settings"})
    async with (
        opened_ledger(settings) as ledger,
        build_worker(client, ledger, load_registry(["tests.security.edge_tools"]), settings, identity="w-bypass"),
    ):
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            AgentRunPlan(agent_run_id=run_id, steps=[step]),
            id=run_id,
            task_queue=settings.task_queue,
        )

        async def peek_ended() -> RunStatus:
            status = await handle.query("status", result_type=RunStatus)
            assert status.tasks[0].status in (TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED), status
            return status

        status = await assert_eventually(peek_ended, timeout=60, message="the peeking step ended")
        await handle.cancel()
    assert status.tasks[0].status is TaskStatus.DEAD_LETTERED, status
    assert "ledger-pw-77" not in status.model_dump_json()


async def test_infinity_never_reaches_a_float_argument(settings: AgentLeaseSettings) -> None:
    client = await connect(settings)
    runs = {f"inf-{n}-{uuid.uuid4().hex[:8]}": value for n, value in enumerate(["inf", "Infinity", "-inf", "nan"])}
    async with (
        opened_ledger(settings) as ledger,
        build_worker(client, ledger, load_registry(["tests.security.round2_tools"]), settings, identity="w-inf"),
    ):
        handles = [
            await client.start_workflow(
                AgentRunWorkflow.run,
                AgentRunPlan(agent_run_id=run, steps=[PlanStep(step_id="s", tool="charge", arguments={"amount": v})]),
                id=run,
                task_queue=settings.task_queue,
            )
            for run, v in runs.items()
        ]

        async def refused() -> None:
            records = [t for run in runs for t in await ledger.list_tasks(run)]
            assert len(records) == len(runs) and all(r.status is TaskStatus.DEAD_LETTERED for r in records), records

        await assert_eventually(refused, timeout=90, message="every infinite amount refused")
        for handle in handles:
            await handle.cancel()
        for run in runs:
            [record] = await ledger.list_tasks(run)
            assert record.last_error is not None and "not a finite number" in record.last_error, record
            assert record.receipt is None


def test_the_finite_check_names_the_tool() -> None:
    from agentlease.limits import check_finite_arguments

    with pytest.raises(PermanentToolError, match="arguments of 'charge' hold inf"):
        check_finite_arguments({"a": [1.0, {"b": float("inf")}]}, "charge")
    assert check_finite_arguments({"a": 1.5}, "charge") == {"a": 1.5}


# -- purge --------------------------------------------------------------------------------------------


def _spec(run: str, step: str, key: str | None = None) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool="send_mail",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=key or f"{run}:{step}",
        lease_ttl=timedelta(minutes=1),
    )


async def _settled(ledger: Ledger, spec: TaskSpec, at: datetime) -> None:
    claim = await ledger.claim(spec, "w", now=at)
    receipt = SettlementReceipt(external_system="mail", external_id=spec.task_id, status="sent", verified_at=at)
    await ledger.settle(claim, receipt, now=at)


async def test_purge_never_removes_what_a_run_still_open_needs(ledger: Ledger) -> None:
    long_ago = await ledger.db_now() - timedelta(days=60)
    # A run still open: its first step settled long ago, its second waits.
    await _settled(ledger, _spec("open-run", "sent"), long_ago)
    waiting = await ledger.claim(_spec("open-run", "next"), "w", now=long_ago)
    await ledger.dead_letter(waiting, error_class=ErrorClass.PERMANENT, error="400", now=long_ago)
    # A finished run that shared its key with a call still open in another run.
    await _settled(ledger, _spec("done-run", "sent", key="shared:order-7"), long_ago)
    await ledger.decide(
        "other-run/sent",
        DecisionKind.AWAIT_APPROVAL,
        by="run",
        reason="gate",
        spec=_spec("other-run", "sent", key="shared:order-7"),
        now=long_ago,
    )
    # A finished run, nothing open anywhere: purged.
    await _settled(ledger, _spec("old-run", "sent"), long_ago)

    counts = await purge(ledger, timedelta(days=30))

    assert (counts.tasks, counts.receipts) == (3, 1), counts  # every old final task; one receipt
    left = {t.task_id for t in await ledger.list_tasks()}
    assert left == {"open-run/next", "other-run/sent"}, left
    assert await ledger.receipt("open-run:sent") is not None  # its run is still open
    assert await ledger.receipt("shared:order-7") is not None  # an open call's key still names it
    assert await ledger.receipt("old-run:sent") is None
    # A retry of the open run's settled call settles from its receipt instead of acting again.
    again = await ledger.claim(_spec("open-run", "sent"), "w")
    assert again.receipt is not None and again.receipt.receipt.external_id == "open-run/sent", again


def test_an_encrypted_payload_without_keys_is_one_line() -> None:
    """The codec server's sibling case in the SDK: the keys-missing codec names the setting."""
    from agentlease.security.codec import CodecKeysMissingError, KeysMissingCodec

    sealed = Payload(metadata={"encoding": ENCODING, KEY_ID: b"k1"}, data=base64.b64encode(b"x"))
    with pytest.raises(CodecKeysMissingError, match="AGENTLEASE_CODEC_KEYS is not set here"):
        asyncio.run(KeysMissingCodec().decode([sealed]))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"a": 1}).encode())
    assert asyncio.run(KeysMissingCodec().decode([plain])) == [plain]
