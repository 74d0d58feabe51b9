"""Keys and fences that cannot be borrowed across callers, at the downstream (third round): over HTTP, the CRM's
``LeaseGuard`` and a service behind ``IdempotencyMiddleware`` refuse a write with no credentials unless they accept
anonymous callers; another caller can neither move nor pin a victim's fence (a fence pinned at 2^63-1 used to block
the victim's key for good); ``Bearer t``, ``bearer t`` and ``BEARER  t`` are one caller."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError

from agentlease.fencing import MAX_GENERATION
from agentlease.mcp import MCPServer
from agentlease.mcp._client import session
from agentlease.mcp._convention import REFUSAL_CODE, lease_meta
from tests.integration.mcp_crm import contacts_of, running_http_crm, server_env
from tests.security.test_middleware import _count, service

pytestmark = pytest.mark.timeout(120)


def meta(key: str, generation: int) -> Any:
    return lease_meta(key, generation, f"mcp/create_contact/{key}", datetime.now(UTC) + timedelta(minutes=1))


async def create(url: str, credentials: str | None, email: str, key: str, generation: int) -> Any:
    """``create_contact`` over HTTP as the caller ``credentials`` (an ``Authorization`` header; ``None``: none):
    its result, or the ``MCPError`` it was refused with."""
    headers = {} if credentials is None else {"Authorization": credentials}
    async with session(MCPServer.http("crm", url, headers=headers)) as client:
        try:
            return await client.call_tool("create_contact", {"name": "N", "email": email}, meta=meta(key, generation))
        except MCPError as refused:
            return refused


async def test_the_mcp_guard_scopes_fences_to_callers_and_refuses_anonymous_ones(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'crm.db'}"
    async with running_http_crm(server_env(database_url, named_callers=True)) as url:
        anonymous = await create(url, None, "nobody@example.com", "run-1:create", 1)
        # Another caller pins the fence of the victim's action (its key and its resource) at the top.
        await create(url, "Bearer attacker", "attacker@example.com", "run-1:create", MAX_GENERATION)
        victim = await create(url, "Bearer victim", "victim@example.com", "run-1:create", 1)
        again = await create(url, "BEARER  victim", "victim@example.com", "run-1:create", 2)

    assert isinstance(anonymous, MCPError), anonymous
    assert anonymous.code == REFUSAL_CODE and anonymous.data["error"] == "missing_credentials"
    assert await contacts_of(database_url, "nobody@example.com") == []
    assert not isinstance(victim, MCPError) and not victim.is_error, victim
    [contact] = await contacts_of(database_url, "victim@example.com")  # the retry replayed: one contact
    assert (contact["idempotency_key"], contact["generation"]) == ("run-1:create", 1)
    assert (
        not isinstance(again, MCPError)
        and not again.is_error
        and (again.meta or {}).get("io.agentlease/replayed") is True
    ), again


async def test_the_middleware_scopes_fences_to_callers_and_refuses_anonymous_ones(ledger_url: str) -> None:
    async with service(ledger_url, anonymous=False) as (client, engine):
        anonymous = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Fencing-Token": "1"})
        pinned = await client.post(
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "k", "Fencing-Token": str(MAX_GENERATION), "Authorization": "Bearer attacker"},
        )
        victim = await client.post(
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "k", "Fencing-Token": "1", "Authorization": "Bearer victim"},
        )
        count = await _count(engine)

    assert (anonymous.status_code, anonymous.json()["error"]) == (401, "missing_credentials")
    assert pinned.status_code == 201
    assert victim.status_code == 201, victim.json()  # not 409 stale: the attacker's fence is its own
    assert count == 2


async def test_a_stale_refusal_names_the_resource_as_the_client_named_it(ledger_url: str) -> None:
    # Long enough that the caller's own copy of it is a digest.
    resource = "articles/" + "r" * 380
    async with service(ledger_url, anonymous=False) as (client, _):

        async def write(key: str, token: int) -> Any:
            headers = {"Idempotency-Key": key, "Fencing-Token": str(token), "Authorization": "Bearer victim"}
            return await client.post("/articles/1", json={}, headers={**headers, "Fencing-Resource": resource})

        newer = await write("k-2", 2)
        stale = await write("k-1", 1)

    assert newer.status_code == 201, newer.json()
    assert stale.status_code == 409, stale.json()
    assert (stale.json()["resource"], stale.json()["current_generation"]) == (resource, 2)
    assert resource in stale.json()["detail"]
