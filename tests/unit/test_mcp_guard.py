"""The server side: ``LeaseGuard`` on the example CRM (the official SDK's ``MCPServer``), called in-process
through the SDK's own client, its keys and fences in a SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
import sqlalchemy as sa
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_types import ElicitResult
from pydantic import BaseModel
from starlette.applications import Starlette

from agentlease.errors import ConfigurationError
from agentlease.fencing import fenced_write
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore
from agentlease.idempotency.convention import scoped_key
from agentlease.idempotency.store import KeyStatus
from agentlease.mcp import EXTENSION, REFUSAL_CODE, REPLAYED_META, LeaseGuard, current_call, effect_transaction
from agentlease.mcp._convention import lease_meta
from examples.mcp.crm_server import build_server
from tests.integration.mcp_crm import contacts_of

EMAIL = "ada@example.com"
ARGS = {"name": "Ada", "email": EMAIL}


def meta(key: str, generation: int | str | None) -> Any:
    entries: dict[str, Any] = lease_meta(key, 0, f"mcp/create_contact/{key}", datetime.now(UTC) + timedelta(minutes=1))
    if generation is None:
        del entries["io.agentlease/fencing-token"]
    else:
        entries["io.agentlease/fencing-token"] = str(generation)
    return entries


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'crm.db'}"


@asynccontextmanager
async def opened(database_url: str) -> AsyncIterator[Client]:
    """The CRM in-process (entered and left in the test's own task, as the SDK's task groups need)."""
    async with Client(build_server(database_url)) as client:
        yield client


async def refusal(crm: Client, arguments: dict[str, Any], entries: Any) -> dict[str, Any]:
    with pytest.raises(MCPError) as refused:
        await crm.call_tool("create_contact", arguments, meta=entries)
    assert refused.value.code == REFUSAL_CODE
    data: dict[str, Any] = refused.value.data
    return data


async def test_a_repeated_key_replays_the_stored_result_and_writes_once(database_url: str) -> None:
    async with opened(database_url) as crm:
        first = await crm.call_tool("create_contact", ARGS, meta=meta("run-1:create", 1))
        again = await crm.call_tool("create_contact", ARGS, meta=meta("run-1:create", 1))
        newer = await crm.call_tool("create_contact", ARGS, meta=meta("run-1:create", 2))

        assert first.structured_content == again.structured_content == newer.structured_content
        assert not (first.meta or {}).get(REPLAYED_META)
        assert (again.meta or {})[REPLAYED_META] is True and (newer.meta or {})[REPLAYED_META] is True
        [contact] = await contacts_of(database_url, EMAIL)
        assert (contact["idempotency_key"], contact["generation"]) == ("run-1:create", 1)
        # The guard advertises itself, so a client knows it may read back and rely on replays.
        assert crm.server_capabilities.extensions is not None
        assert crm.server_capabilities.extensions[EXTENSION]["tools"] == ["create_contact"]


async def test_an_older_fencing_token_than_the_newest_seen_is_refused_even_where_a_result_is_stored(
    database_url: str,
) -> None:
    async with opened(database_url) as crm:
        await crm.call_tool("create_contact", ARGS, meta=meta("run-2:create", 2))

        data = await refusal(crm, ARGS, meta("run-2:create", 1))

        assert data == {
            "error": "stale_fencing_token",
            "detail": data["detail"],
            "resource": "mcp/create_contact/run-2:create",
            "generation": 1,
            "current_generation": 2,
        }
        assert "generation 1 refused" in data["detail"]
        assert len(await contacts_of(database_url, EMAIL)) == 1


async def test_a_newer_replay_moves_the_fence_so_the_older_holder_is_refused_afterwards(database_url: str) -> None:
    async with opened(database_url) as crm:
        await crm.call_tool("create_contact", ARGS, meta=meta("run-3:create", 1))
        await crm.call_tool("create_contact", ARGS, meta=meta("run-3:create", 2))  # replayed, fence now 2

        data = await refusal(crm, ARGS, meta("run-3:create", 1))

        assert (data["error"], data["current_generation"]) == ("stale_fencing_token", 2)


async def test_a_missing_key_is_refused_and_nothing_is_written(database_url: str) -> None:
    async with opened(database_url) as crm:
        with pytest.raises(MCPError) as refused:
            await crm.call_tool("create_contact", ARGS)
        assert refused.value.code == REFUSAL_CODE
        assert refused.value.data["error"] == "missing_idempotency_key"
        assert "io.agentlease/idempotency-key" in refused.value.message
        assert await contacts_of(database_url, EMAIL) == []
        # An unguarded tool needs no key.
        found = await crm.call_tool("find_contact", {"email": EMAIL})
        assert found.structured_content == {"contacts": []}


async def test_a_key_used_with_other_arguments_is_refused(database_url: str) -> None:
    async with opened(database_url) as crm:
        await crm.call_tool("create_contact", ARGS, meta=meta("run-4:create", 1))

        data = await refusal(crm, {"name": "Grace", "email": EMAIL}, meta("run-4:create", 1))

        assert data["error"] == "idempotency_key_reused"


async def test_a_malformed_token_is_refused(database_url: str) -> None:
    async with opened(database_url) as crm:
        data = await refusal(crm, ARGS, meta("run-5:create", "one"))
        assert (data["error"], data["key"]) == ("invalid_fencing_token", "io.agentlease/fencing-token")


async def test_the_readback_answers_whether_the_call_with_a_key_happened(database_url: str) -> None:
    async with opened(database_url) as crm:

        async def was_applied(key: str) -> Any:
            answer = await crm.call_tool("agentlease_was_applied", {}, meta=meta(key, None))
            return answer.structured_content

        assert await was_applied("run-6:create") == {"applied": False, "status": "absent", "result": None}
        created = await crm.call_tool("create_contact", ARGS, meta=meta("run-6:create", None))  # no token: key only

        found = await was_applied("run-6:create")

        assert (found["applied"], found["status"]) == (True, "done")
        assert found["result"]["structuredContent"] == created.structured_content
        # The readback tool is read-only and never guarded itself.
        tools = {tool.name: tool for tool in (await crm.list_tools()).tools}
        assert tools["agentlease_was_applied"].annotations is not None
        assert tools["agentlease_was_applied"].annotations.read_only_hint is True


async def test_integer_keys_and_tokens_in_meta_are_refused_as_not_strings(database_url: str) -> None:
    """The convention's ``_meta`` entries are strings: an integer key or token is refused, nothing written."""
    async with opened(database_url) as crm:
        as_number = {**meta("run-9:create", 1), "io.agentlease/idempotency-key": 42}
        key = await refusal(crm, ARGS, as_number)
        token = await refusal(crm, ARGS, {**meta("run-9:create", 1), "io.agentlease/fencing-token": 7})
    assert (key["error"], token["error"]) == ("invalid_idempotency_key", "invalid_fencing_token")
    assert await contacts_of(database_url, EMAIL) == []


def test_a_guard_declared_with_a_string_of_tools_or_a_short_fencing_key_is_refused(tmp_path: Path) -> None:
    """``tools="create_contact"`` would guard its letters; a fencing key under 16 bytes would be guessable: both
    are refused at construction, in one line."""
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    refused = [
        lambda: LeaseGuard(store, tools="create_contact"),
        lambda: LeaseGuard(store, commits_with_key="create_contact"),
        lambda: LeaseGuard(store, tools=["create_contact", ""]),
        lambda: LeaseGuard(store, fencing_key="short"),
        lambda: IdempotencyMiddleware(Starlette(), store=store, fencing_key=b"x" * 15),
    ]
    for build in refused:
        with pytest.raises(ConfigurationError) as error:
            build()
        assert "\n" not in str(error.value)
    assert LeaseGuard(store, tools=["create_contact"], fencing_key="k" * 16).guards("create_contact")


async def test_a_lease_that_expired_by_the_servers_clock_is_refused(database_url: str) -> None:
    """A call whose ``lease-expires-at`` has passed comes from a holder whose lease lapsed: refused ``lease_expired``,
    nothing written; the same call with a lease still running goes through."""
    async with opened(database_url) as crm:
        lapsed = lease_meta(
            "run-10:create", 1, "mcp/create_contact/run-10:create", datetime.now(UTC) - timedelta(seconds=5)
        )
        data = await refusal(crm, ARGS, lapsed)
        assert await contacts_of(database_url, EMAIL) == []
        running: Any = lease_meta(
            "run-10:create", 1, "mcp/create_contact/run-10:create", datetime.now(UTC) + timedelta(minutes=1)
        )
        await crm.call_tool("create_contact", ARGS, meta=running)
    assert (data["error"], data["key"]) == ("lease_expired", "io.agentlease/lease-expires-at")
    assert len(await contacts_of(database_url, EMAIL)) == 1


async def test_a_lease_expiring_at_the_end_of_the_calendar_is_a_lease_still_running(database_url: str) -> None:
    """``lease-expires-at`` 9999-12-31T23:59:59Z is a valid time far ahead: the call runs once and its answer is
    replayed, where adding the clock skew to it used to overflow after the key was claimed and strand the key."""
    far: Any = {**meta("run-11:create", 1), "io.agentlease/lease-expires-at": "9999-12-31T23:59:59Z"}
    async with opened(database_url) as crm:
        first = await crm.call_tool("create_contact", ARGS, meta=far)
        again = await crm.call_tool("create_contact", ARGS, meta=far)
    assert not first.is_error and (again.meta or {})[REPLAYED_META] is True
    assert again.structured_content == first.structured_content
    assert len(await contacts_of(database_url, EMAIL)) == 1


@asynccontextmanager
async def writer(tmp_path: Path, effects: list[str], answer: str = "written", **guard: Any) -> AsyncIterator[Client]:
    """A server whose guarded tool ``write`` records its effect in ``effects`` and answers ``answer``."""
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    server = MCPServer("writer", extensions=[LeaseGuard(store, **guard)])

    @server.tool()
    async def write(text: str) -> str:
        effects.append(text)
        return answer

    try:
        async with Client(server) as client:
            yield client
    finally:
        await store.close()


class Confirmation(BaseModel):
    ok: bool


async def ask(text: str) -> Any:
    """Asks the client to confirm a write (``Resolve(ask)``)."""
    return Elicit(f"write {text}?", Confirmation)


def write_meta(key: str | None, token: str | None, resource: str | None = None) -> Any:
    """The ``_meta`` of a call to ``write``, without the entries given as ``None``."""
    entries = {
        "io.agentlease/idempotency-key": key,
        "io.agentlease/fencing-token": token,
        "io.agentlease/resource": resource,
    }
    return {name: value for name, value in entries.items() if value is not None}


async def write_refused(client: Client, entries: Any, text: str = "refused") -> dict[str, Any]:
    return await refusal_of(client, "write", {"text": text}, entries)


async def refusal_of(client: Client, tool: str, arguments: dict[str, Any], entries: Any) -> dict[str, Any]:
    with pytest.raises(MCPError) as refused:
        await client.call_tool(tool, arguments, meta=entries)
    assert refused.value.code == REFUSAL_CODE
    data: dict[str, Any] = refused.value.data
    return data


async def test_an_answer_that_cannot_be_stored_holds_the_key_in_doubt_after_the_tools_effect(tmp_path: Path) -> None:
    """The tool wrote, then answered text JSON cannot carry (a lone surrogate): its effect may have landed, so the
    key is held in doubt for a person (G11), never left in flight nor given back; the tool never runs again."""
    effects: list[str] = []
    entries = write_meta("run-12:write", "1")
    async with writer(tmp_path, effects, answer="half a pair: \ud800") as client:
        with pytest.raises(MCPError) as failed:
            await client.call_tool("write", {"text": "once"}, meta=entries)
        retried = await write_refused(client, entries, text="once")
        read_back = await client.call_tool("agentlease_was_applied", {}, meta=entries)
    assert failed.value.code != REFUSAL_CODE
    assert retried["error"] == "idempotency_key_in_doubt"
    assert read_back.structured_content == {"applied": None, "status": "in_doubt", "result": None}
    assert effects == ["once"]


async def test_a_call_without_a_key_still_needs_a_fencing_token_where_the_guard_requires_one(tmp_path: Path) -> None:
    """``require_key=False, require_fencing_token=True``: a call without a key and without a token is refused
    ``missing_fencing_token``, and one with a superseded token ``stale_fencing_token`` (G2); the current generation
    runs."""
    effects: list[str] = []
    resource = "mcp/write/run-13:write"
    async with writer(tmp_path, effects, require_key=False, require_fencing_token=True) as client:
        await client.call_tool("write", {"text": "generation 5"}, meta=write_meta("run-13:write", "5"))
        missing = await write_refused(client, write_meta(None, None))
        stale = await write_refused(client, write_meta(None, "1", resource))
        await client.call_tool("write", {"text": "generation 5, no key"}, meta=write_meta(None, "5", resource))
    assert missing["error"] == "missing_fencing_token"
    assert (stale["error"], stale["resource"], stale["current_generation"]) == ("stale_fencing_token", resource, 5)
    assert effects == ["generation 5", "generation 5, no key"]


async def test_a_call_without_a_key_passes_the_fence_of_the_resource_its_token_names(tmp_path: Path) -> None:
    """Where a key is not required, a token sent without one is still checked against its resource's fence and
    moves it (G2): a superseded token is refused, a newer one refuses the older holder's keyed call afterwards,
    and a token that names no resource (the default resource is named after the key) is refused."""
    effects: list[str] = []
    resource = "mcp/write/run-14:write"
    async with writer(tmp_path, effects, require_key=False) as client:
        await client.call_tool("write", {"text": "generation 5"}, meta=write_meta("run-14:write", "5"))
        stale = await write_refused(client, write_meta(None, "4", resource))
        await client.call_tool("write", {"text": "generation 6"}, meta=write_meta(None, "6", resource))
        superseded = await write_refused(client, write_meta("run-14:again", "5", resource))
        unnamed = await write_refused(client, write_meta(None, "7"))
        await client.call_tool("write", {"text": "unfenced"})  # no key and no token: let through, as configured
    assert (stale["error"], stale["current_generation"]) == ("stale_fencing_token", 5)
    assert (superseded["error"], superseded["current_generation"]) == ("stale_fencing_token", 6)
    assert (unnamed["error"], unnamed["key"]) == ("invalid_fencing_resource", "io.agentlease/resource")
    assert effects == ["generation 5", "generation 6", "unfenced"]


@pytest.mark.parametrize("commit", ["effect_transaction", "fenced_write"])
@pytest.mark.parametrize("keys", [(None, None), ("run-15:older", "run-15:newer")], ids=["without-keys", "keyed"])
async def test_an_older_call_still_inside_the_service_is_fenced_at_its_commit(
    tmp_path: Path, keys: tuple[str | None, str | None], commit: str
) -> None:
    """A call with a token passes its fence on arrival, works, and commits in ``effect_transaction`` (or checks the
    fence itself with ``fenced_write``); with a key or without one (``require_key=False``). A newer generation
    arriving while the older call is still inside the service moves the fence, so the older call's commit checks
    it again, writes nothing, and is answered ``stale_fencing_token``, though ``MCPServer`` makes an error result of
    the tool's exception (G2, ``docs/edge.md``). A key is given back when the refused commit was the effect's own
    transaction, and stays in doubt after a ``fenced_write`` of the tool's (which may have acted before it)."""
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    table = sa.Table("writes", sa.MetaData(), sa.Column("text", sa.String, nullable=False))
    async with store.engine.begin() as conn:
        await conn.run_sync(table.metadata.create_all)
    inside, go_on = anyio.Event(), anyio.Event()
    server = MCPServer("writer", extensions=[LeaseGuard(store, require_key=False)])

    @server.tool()
    async def write(text: str) -> str:
        if text == "generation 1":  # the older call's slow work, before its commit
            inside.set()
            await go_on.wait()
        if commit == "fenced_write":
            call = current_call()
            assert call is not None and call.fencing is not None
            async with fenced_write(store.engine, call.fencing.resource_key, call.fencing.generation) as conn:
                await conn.execute(table.insert().values(text=text))
            return "written"
        async with effect_transaction(store.engine) as effect:
            await effect.conn.execute(table.insert().values(text=text))
            effect.done("written")
        return "written"

    resource = "mcp/write/run-15:write"
    outcomes: dict[str, Any] = {}

    async def call(text: str, token: str) -> None:
        try:
            entries = write_meta(keys[int(token) - 1], token, resource)
            outcomes[text] = await client.call_tool("write", {"text": text}, meta=entries)
        except MCPError as exc:
            outcomes[text] = exc

    try:
        async with Client(server) as client, anyio.create_task_group() as tasks:
            tasks.start_soon(call, "generation 1", "1")
            await inside.wait()
            await call("generation 2", "2")
            go_on.set()
        older_key = None if keys[0] is None else await store.lookup(scoped_key("", keys[0]))
        async with store.engine.connect() as conn:
            written = (await conn.execute(sa.select(table.c.text))).scalars().all()
    finally:
        await store.close()
    assert written == ["generation 2"]
    assert not outcomes["generation 2"].is_error
    older = outcomes["generation 1"]
    assert isinstance(older, MCPError) and older.code == REFUSAL_CODE, older
    assert (older.data["error"], older.data["current_generation"]) == ("stale_fencing_token", 2)
    if commit == "effect_transaction" or keys[0] is None:
        assert older_key is None  # given back: its effect's transaction rolled back (or no key to hold)
    else:
        assert older_key is not None and older_key.status is KeyStatus.IN_DOUBT


async def test_arguments_holding_a_lone_surrogate_are_keyed_as_any_others(tmp_path: Path) -> None:
    """JSON can carry a lone surrogate (``"\\ud800"``), which UTF-8 cannot: the guard still hashes such arguments
    for the key, so the call runs once and its retry replays it (it was an internal error, -32603)."""
    effects: list[str] = []
    entries = write_meta("run-16:write", "1")
    async with writer(tmp_path, effects) as client:
        first = await client.call_tool("write", {"text": "half \ud800 a pair"}, meta=entries)
        again = await client.call_tool("write", {"text": "half \ud800 a pair"}, meta=entries)
        other = await write_refused(client, entries, text="half \ud801 a pair")
    assert not first.is_error and (again.meta or {})[REPLAYED_META] is True
    assert other["error"] == "idempotency_key_reused"
    assert effects == ["half \ud800 a pair"]


async def test_a_tool_that_asks_its_client_first_runs_in_the_round_that_brings_the_answer(tmp_path: Path) -> None:
    """A guarded tool with a parameter resolved by asking the client (``Resolve(Elicit)``): its first round answers
    ``InputRequiredResult`` before the tool runs. That round stores nothing and gives the key back, so the round that
    brings the answer runs the tool once and its result is what the key replays and reads back (G11)."""
    effects: list[str] = []
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    server = MCPServer("writer", extensions=[LeaseGuard(store)])

    @server.tool()
    async def write(text: str, confirm: Annotated[Confirmation, Resolve(ask)]) -> dict[str, Any]:
        effects.append(text)
        return {"written": text, "confirmed": confirm.ok}

    async def confirm(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={"ok": True})

    entries = write_meta("run-17:write", "1")
    try:
        async with Client(server, elicitation_callback=confirm) as client:
            first = await client.call_tool("write", {"text": "asked first"}, meta=entries)
            again = await client.call_tool("write", {"text": "asked first"}, meta=entries)
            read_back = await client.call_tool("agentlease_was_applied", {}, meta=entries)
    finally:
        await store.close()
    assert first.structured_content == {"written": "asked first", "confirmed": True}, first
    assert again.structured_content == first.structured_content and (again.meta or {})[REPLAYED_META] is True
    assert read_back.structured_content is not None and read_back.structured_content["applied"] is True
    assert effects == ["asked first"]


async def test_a_resource_no_database_can_store_is_refused_in_one_line(tmp_path: Path) -> None:
    """A resource holding NUL (PostgreSQL's text refuses it) or a lone surrogate (UTF-8 cannot carry it) is refused
    ``invalid_fencing_resource``, keyed or not, and the tool never runs (it was an internal error, -32603)."""
    effects: list[str] = []
    async with writer(tmp_path, effects, require_key=False) as client:
        refused = [
            await write_refused(client, write_meta(key, "1", f"refunds/{bad}"))
            for key in ("run-18:write", None)
            for bad in ("\x00", "\ud800")
        ]
    assert [(data["error"], "\n" in data["detail"]) for data in refused] == [("invalid_fencing_resource", False)] * 4
    assert effects == []


async def test_a_call_without_a_key_may_commit_in_several_fenced_transactions(tmp_path: Path) -> None:
    """``require_key=False``: a call with a token and no key stores no answer, so it may commit more than once, each
    commit fenced; its ``current_call()`` carries the lease's expiry the client sent."""
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    seen: list[Any] = []
    server = MCPServer("writer", extensions=[LeaseGuard(store, require_key=False)])

    @server.tool()
    async def write(text: str) -> str:
        call = current_call()
        assert call is not None
        seen.append((call.idempotency_key, call.fencing and call.fencing.generation, call.lease_expires_at))
        for part in ("first", "second"):
            async with effect_transaction(store.engine) as effect:
                await effect.conn.execute(sa.text("SELECT 1"))
                seen.append(part)
        return "written"

    expires = datetime.now(UTC) + timedelta(minutes=1)
    entries: Any = {**write_meta(None, "3", "refunds/r-1"), "io.agentlease/lease-expires-at": expires.isoformat()}
    try:
        async with Client(server) as client:
            answer = await client.call_tool("write", {"text": "twice"}, meta=entries)
    finally:
        await store.close()
    assert not answer.is_error, answer
    assert seen == [(None, 3, expires), "first", "second"]


async def test_the_readback_refuses_malformed_meta_in_one_line(tmp_path: Path) -> None:
    """The readback tool reads ``_meta`` as a guarded call does: a malformed key or token is a refusal naming the
    entry, not an error result with a traceback on the server."""
    async with writer(tmp_path, []) as client:
        refused = [
            await refusal_of(client, "agentlease_was_applied", {}, entries)
            for entries in (write_meta("run\n19", None), write_meta("run-19:write", "not a token"))
        ]
    assert [data["error"] for data in refused] == ["invalid_idempotency_key", "invalid_fencing_token"]


async def test_a_refused_fence_of_another_resource_says_nothing_of_the_calls_own_effect(tmp_path: Path) -> None:
    """Only a refusal of the call's own fence proves its effect did not happen: a tool that wrote, then failed on
    the fence of another resource, leaves its key in doubt, never given back to run the write again (G11)."""
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    async with fenced_write(store.engine, "ledgers/other", 2):
        pass  # another resource, already at generation 2
    effects: list[str] = []
    server = MCPServer("writer", extensions=[LeaseGuard(store)])

    @server.tool()
    async def write(text: str) -> str:
        effects.append(text)  # the call's own effect, outside any fence
        async with fenced_write(store.engine, "ledgers/other", 1):
            pass
        return "written"

    entries = write_meta("run-20:write", "1")
    try:
        async with Client(server) as client:
            failed = await client.call_tool("write", {"text": "once"}, meta=entries)
            read_back = await client.call_tool("agentlease_was_applied", {}, meta=entries)
            again = await write_refused(client, entries, text="once")
    finally:
        await store.close()
    assert failed.is_error
    assert read_back.structured_content == {"applied": None, "status": "in_doubt", "result": None}
    assert again["error"] == "idempotency_key_in_doubt"
    assert effects == ["once"]
