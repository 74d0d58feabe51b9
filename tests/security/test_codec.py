"""Payload encryption on the real dev server (finding 4): with the codec on, a run's history holds
no plaintext argument, output or receipt; the agentlease CLI and the codec server still show them;
rotated keys open old payloads; an unknown key id is a clear error; nothing reaches search
attributes."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client, WorkflowHandle

from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.runner import Background, Cli
from tests.acceptance.test_cli import free_port
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.security.edge_cli import agentlease

pytestmark = pytest.mark.timeout(120)

OLD_KEY = "k1:" + base64.b64encode(b"1" * 32).decode()
NEW_KEY = "k2:" + base64.b64encode(b"2" * 32).decode()


@asynccontextmanager
async def encrypted_run(settings: AgentLeaseSettings, marker: str) -> AsyncIterator[tuple[WorkflowHandle, str]]:
    """A worker whose client encrypts, and a settled run whose argument, output and receipt are ``marker``."""
    registry = load_registry(["tests.security.edge_tools"])
    client = await connect(settings, identity="codec-worker")
    run_id = f"codec-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(
        agent_run_id=run_id, steps=[PlanStep(step_id="echo", tool="echo_marker", arguments={"text": marker})]
    )
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="codec-w"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        status = await handle.result()
        assert RunStatus.model_validate(status).tasks[0].status == "settled", status
        yield handle, run_id


def readable(history: object) -> str:
    """History JSON plus every payload's bytes decoded from base64: what anyone reading it sees."""
    seen: list[str] = [json.dumps(history)]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    seen.append(base64.b64decode(value).decode("utf-8", "replace"))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(history)
    return "\n".join(seen)


async def raw_history_text(temporal_address: str, run_id: str) -> str:
    """The run's history as the server stores it, read by a client without the codec (:func:`readable`)."""
    raw = await Client.connect(temporal_address)
    return readable((await raw.get_workflow_handle(run_id).fetch_history()).to_json_dict())


async def test_history_is_encrypted_and_cli_still_shows_it(settings: AgentLeaseSettings, temporal_address: str) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    settings = settings.model_copy(update={"codec_keys": OLD_KEY})
    async with encrypted_run(settings, marker) as (handle, run_id):
        stored = await raw_history_text(temporal_address, run_id)
        assert marker not in stored, "plaintext argument/output/receipt in Temporal history"
        assert base64.b64encode(b"binary/encrypted").decode() in stored  # metadata, base64 in JSON

        # Tool arguments and outputs never reach search attributes.
        described = await handle.describe()
        fields = described.raw_description.workflow_execution_info.search_attributes.indexed_fields
        shown = json.dumps({name: payload.data.decode() for name, payload in fields.items()})
        assert "AgentLeaseTool" in shown and "echo_marker" in shown  # what is there: names, never arguments
        assert marker not in shown

        env = {
            "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
            "AGENTLEASE_LEDGER_URL": settings.ledger_url,
            "AGENTLEASE_CODEC_KEYS": OLD_KEY,
        }
        shown_by_cli = await agentlease("status", run_id, "--json", env=env)
        assert shown_by_cli.returncode == 0, shown_by_cli.stderr
        assert json.loads(shown_by_cli.stdout)["tasks"][0]["receipt"]["external_id"] == marker

        # Key rotation: a new key first, the old one still listed, opens the old run.
        rotated = await connect(settings.model_copy(update={"codec_keys": f"{NEW_KEY},{OLD_KEY}"}))
        old = RunStatus.model_validate(await rotated.get_workflow_handle(run_id).result())
        assert old.tasks[0].receipt is not None and old.tasks[0].receipt.external_id == marker

        # The old key dropped: a clear error naming the key id, not garbage.
        from agentlease.security.codec import UnknownCodecKeyError

        dropped = await connect(settings.model_copy(update={"codec_keys": NEW_KEY}))
        with pytest.raises(Exception) as info:
            await dropped.get_workflow_handle(run_id).result()
        chain = [info.value, info.value.__cause__, info.value.__context__]
        assert any(isinstance(e, UnknownCodecKeyError) for e in chain) or "key id 'k1'" in str(info.value), chain


async def test_codec_server_decodes_for_those_allowed(settings: AgentLeaseSettings, temporal_address: str) -> None:
    from google.protobuf import json_format
    from temporalio.api.common.v1 import Payloads

    from agentlease.security.codec import EncryptionCodec
    from agentlease.security.codec_server import codec_app

    marker = f"marker-{uuid.uuid4().hex}"
    settings = settings.model_copy(update={"codec_keys": OLD_KEY})
    async with encrypted_run(settings, marker) as (_handle, run_id):
        raw = await Client.connect(temporal_address)
        history = await raw.get_workflow_handle(run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes.input
        body = json_format.MessageToJson(Payloads(payloads=list(started.payloads)))
        assert marker not in body

        app = codec_app(EncryptionCodec.from_text(OLD_KEY), token="s3cret", origins=["http://localhost:8233"])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://codec") as http:
            anonymous = await http.post("/decode", content=body, headers={"content-type": "application/json"})
            assert anonymous.status_code == 401 and marker not in anonymous.text

            allowed = await http.post(
                "/decode", content=body, headers={"content-type": "application/json", "authorization": "Bearer s3cret"}
            )
            assert allowed.status_code == 200, allowed.text
            decoded = json_format.Parse(allowed.text, Payloads())
            assert marker in decoded.payloads[0].data.decode()

            # The UI calls from the browser: the preflight admits its origin, and no other.
            preflight = await http.options(
                "/decode",
                headers={
                    "origin": "http://localhost:8233",
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "content-type,x-namespace,authorization",
                },
            )
            assert preflight.headers.get("access-control-allow-origin") == "http://localhost:8233"
            elsewhere = await http.options(
                "/decode", headers={"origin": "http://evil.example", "access-control-request-method": "POST"}
            )
            assert elsewhere.headers.get("access-control-allow-origin") is None

            # Encoding round-trips through the server too.
            sealed = await http.post("/encode", content=allowed.text, headers={"authorization": "Bearer s3cret"})
            assert sealed.status_code == 200 and marker not in sealed.text
            garbage = await http.post("/decode", content=b"not json", headers={"authorization": "Bearer s3cret"})
            assert garbage.status_code == 400


def test_keys_are_checked_and_rotation_opens_old_payloads() -> None:
    import asyncio

    from temporalio.api.common.v1 import Payload

    from agentlease.errors import ConfigurationError
    from agentlease.security.codec import EncryptionCodec, UnknownCodecKeyError, new_key_entry, parse_keys

    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"password": "x"}')
    old = EncryptionCodec.from_text(OLD_KEY)
    [sealed] = asyncio.run(old.encode([plain]))
    assert sealed.metadata["encryption-key-id"] == b"k1" and b"password" not in sealed.data
    rotated = EncryptionCodec.from_text(f"{NEW_KEY},{OLD_KEY}")
    assert asyncio.run(rotated.decode([sealed])) == [plain]
    [resealed] = asyncio.run(rotated.encode([plain]))
    assert resealed.metadata["encryption-key-id"] == b"k2"
    with pytest.raises(UnknownCodecKeyError, match="key id 'k1', which is not among AGENTLEASE_CODEC_KEYS \\(k2\\)"):
        asyncio.run(EncryptionCodec.from_text(NEW_KEY).decode([sealed]))
    forged = Payload(metadata=dict(sealed.metadata), data=sealed.data[:-1] + bytes([sealed.data[-1] ^ 1]))
    with pytest.raises(UnknownCodecKeyError, match="does not open it"):
        asyncio.run(old.decode([forged]))
    assert asyncio.run(old.decode([plain])) == [plain]  # history from before the codec was on
    for bad in ("k1", "k1:notbase64!", "k1:" + base64.b64encode(b"short").decode(), f"{OLD_KEY},{OLD_KEY}", ","):
        with pytest.raises(ConfigurationError):
            parse_keys(bad)
    assert parse_keys(new_key_entry("2026-12"))[0][0] == "2026-12"


async def test_temporal_cli_decodes_through_the_codec_server_command(
    settings: AgentLeaseSettings, temporal_address: str, tmp_path: Path
) -> None:
    """`agentlease codec-server` as its own process; the `temporal` CLI shows the run sealed without it,
    and decrypted through it with the token."""
    from agentlease.runtime.devserver import temporal_binary

    marker = f"marker-{uuid.uuid4().hex}"
    settings = settings.model_copy(update={"codec_keys": OLD_KEY})
    port = free_port()
    env = {"AGENTLEASE_CODEC_KEYS": OLD_KEY, "AGENTLEASE_CODEC_SERVER_TOKEN": "tok-1"}
    server = Background(Cli(cwd=tmp_path, data_dir=tmp_path / "data"), "codec-server", "--port", str(port), env=env)
    try:
        await asyncio.to_thread(server.wait_for_line, "codec server on", timeout=60)
        async with encrypted_run(settings, marker) as (_handle, run_id):
            show = [temporal_binary(), "workflow", "show", "-w", run_id, "--address", temporal_address, "-o", "json"]
            sealed = await asyncio.to_thread(subprocess.run, show, capture_output=True, text=True, check=False)
            assert sealed.returncode == 0, sealed.stderr
            assert marker not in readable(json.loads(sealed.stdout))
            assert base64.b64encode(b"binary/encrypted").decode() in sealed.stdout
            codec = ["--codec-endpoint", f"http://127.0.0.1:{port}", "--codec-auth", "Bearer tok-1"]
            opened = await asyncio.to_thread(
                subprocess.run, [*show, *codec], capture_output=True, text=True, check=False
            )
            assert opened.returncode == 0, opened.stderr
            assert marker in readable(json.loads(opened.stdout))
            wrong = await asyncio.to_thread(
                subprocess.run,
                [*show, "--codec-endpoint", f"http://127.0.0.1:{port}", "--codec-auth", "Bearer nope"],
                capture_output=True,
                text=True,
                check=False,
            )
            assert marker not in wrong.stdout + (readable(json.loads(wrong.stdout)) if wrong.returncode == 0 else "")
    finally:
        await asyncio.to_thread(server.stop)


async def test_the_codec_wraps_a_framework_plugins_converter(settings: AgentLeaseSettings) -> None:
    """An agent framework's plugin sets its own converter; the codec still seals its payloads."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.plugin import SimplePlugin

    from agentlease.security.codec import EncryptionCodec

    framework = SimplePlugin("framework", data_converter=pydantic_data_converter)
    client = await connect(settings.model_copy(update={"codec_keys": OLD_KEY}), plugins=[framework])
    converter = client.data_converter
    assert isinstance(converter.payload_codec, EncryptionCodec)
    assert converter.payload_converter_class is pydantic_data_converter.payload_converter_class
    [sealed] = await converter.encode(["a secret argument"])
    assert b"secret" not in sealed.SerializeToString()
    assert await converter.decode([sealed], [str]) == ["a secret argument"]
