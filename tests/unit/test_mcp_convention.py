"""The ``_meta`` convention of leased MCP calls, the static declaration of MCP tools, and the refusals
of MCP objects where agentlease cannot lease them."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from agents.mcp import MCPServerStdio
from pydantic import BaseModel
from pydantic_ai import FunctionToolset

from agentlease import leased
from agentlease.enums import SideEffectClass
from agentlease.errors import ConfigurationError
from agentlease.mcp import MCPServer, ToolPolicy, guess_side_effect, mcp_tools
from agentlease.mcp._convention import (
    FENCING_TOKEN_META,
    IDEMPOTENCY_KEY_META,
    LEASE_EXPIRES_AT_META,
    RESOURCE_META,
    MetaError,
    Refusal,
    default_resource,
    lease_meta,
    read_lease_meta,
)
from agentlease.openai_agents import leased_tool
from agentlease.pydantic_ai import LeasedToolset

CRM = MCPServer.stdio("crm", "python", ["-m", "crm_server"])
TTL = timedelta(seconds=5)


def test_lease_meta_puts_every_entry_under_one_namespace_and_reads_back() -> None:
    expires = datetime(2026, 5, 1, 12, 0, 3, 250000, tzinfo=timezone(timedelta(hours=2)))
    meta = lease_meta("run-7:create", "3.c2lnbmF0dXJl", "mcp/create_contact/run-7:create", expires)

    assert meta == {
        "io.agentlease/idempotency-key": "run-7:create",
        "io.agentlease/fencing-token": "3.c2lnbmF0dXJl",
        "io.agentlease/resource": "mcp/create_contact/run-7:create",
        "io.agentlease/lease-expires-at": "2026-05-01T10:00:03.250Z",
    }
    read = read_lease_meta({**meta, "progressToken": 4, "io.modelcontextprotocol/protocolVersion": "2026-07-28"})
    assert (read.idempotency_key, read.fencing_token, read.resource) == (
        "run-7:create",
        "3.c2lnbmF0dXJl",
        "mcp/create_contact/run-7:create",
    )
    assert read.lease_expires_at == expires
    assert read_lease_meta(None) == read_lease_meta({}) and read_lease_meta(None).idempotency_key is None
    assert default_resource("create_contact", "run-7:create") == "mcp/create_contact/run-7:create"
    with pytest.raises(ValueError, match="timezone-aware"):
        lease_meta("k", 1, "r", datetime(2026, 5, 1))


@pytest.mark.parametrize(
    ("entry", "value", "refusal"),
    [
        (IDEMPOTENCY_KEY_META, "", Refusal.INVALID_KEY),
        (IDEMPOTENCY_KEY_META, "k" * 256, Refusal.INVALID_KEY),
        (IDEMPOTENCY_KEY_META, "tab\there", Refusal.INVALID_KEY),
        (IDEMPOTENCY_KEY_META, ["k"], Refusal.INVALID_KEY),
        (FENCING_TOKEN_META, "-1", Refusal.INVALID_TOKEN),
        (FENCING_TOKEN_META, "1.sig with space", Refusal.INVALID_TOKEN),
        (FENCING_TOKEN_META, str(2**63), Refusal.INVALID_TOKEN),
        (FENCING_TOKEN_META, True, Refusal.INVALID_TOKEN),
        (RESOURCE_META, "r" * 401, Refusal.INVALID_RESOURCE),
        (LEASE_EXPIRES_AT_META, "tomorrow", Refusal.INVALID_EXPIRY),
        (LEASE_EXPIRES_AT_META, "2026-05-01T10:00:00", Refusal.INVALID_EXPIRY),
    ],
)
def test_a_malformed_entry_is_refused_by_the_http_conventions_rules(
    entry: str, value: object, refusal: Refusal
) -> None:
    with pytest.raises(MetaError) as refused:
        read_lease_meta({IDEMPOTENCY_KEY_META: "k", entry: value})
    assert (refused.value.refusal, refused.value.key) == (refusal, entry)
    assert entry in str(refused.value) and "Idempotency-Key" not in str(refused.value)


def test_a_generation_travels_as_a_decimal_string_not_an_integer() -> None:
    assert read_lease_meta({FENCING_TOKEN_META: "7"}).fencing_token == "7"
    with pytest.raises(MetaError, match="must be a string"):
        read_lease_meta({FENCING_TOKEN_META: 7})


@pytest.mark.parametrize(
    ("annotations", "guarded", "expected"),
    [
        ({"readOnlyHint": True, "destructiveHint": True}, False, SideEffectClass.READ_ONLY),
        ({"idempotentHint": True}, False, SideEffectClass.IDEMPOTENT),
        ({"readOnlyHint": False, "destructiveHint": False}, True, SideEffectClass.FENCED),
        ({"destructiveHint": False}, False, SideEffectClass.UNSAFE),
        (None, False, SideEffectClass.UNSAFE),  # MCP's defaults: not read-only, destructive, not idempotent
    ],
)
def test_annotations_give_a_guess_of_the_side_effect_class(
    annotations: dict[str, bool] | None, guarded: bool, expected: SideEffectClass
) -> None:
    listed = {"name": "t", "annotations": annotations} if annotations is not None else {"name": "t"}
    assert guess_side_effect(listed, guarded=guarded) is expected


class CreateContact(BaseModel):
    name: str
    email: str


LISTED = [
    {
        "name": "create_contact",
        "description": "Create a contact in the CRM.",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        "annotations": {"destructiveHint": False},
    },
    {"name": "find_contact", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    {"name": "merge_contacts", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}},
]


def test_declared_policies_win_over_the_default_and_the_listed_guesses() -> None:
    tools = mcp_tools(
        CRM,
        default=ToolPolicy(lease_ttl=TTL, max_attempts=3),
        tools={"create_contact": ToolPolicy(side_effect="fenced", args=CreateContact, lease_ttl=timedelta(seconds=8))},
        listed=LISTED,
        prefix="crm_",
    )

    infos = {tool.name: tool.info() for tool in tools}
    assert list(infos) == ["crm_create_contact", "crm_find_contact", "crm_merge_contacts"]
    create = infos["crm_create_contact"]
    assert (create.side_effect_class, create.lease_ttl, create.max_attempts, create.requires_approval) == (
        SideEffectClass.FENCED,
        timedelta(seconds=8),
        3,
        False,
    )
    assert infos["crm_find_contact"].side_effect_class is SideEffectClass.READ_ONLY  # guessed
    assert infos["crm_merge_contacts"].side_effect_class is SideEffectClass.IDEMPOTENT  # guessed
    by_name = {tool.name: tool for tool in tools}
    # The model sees the declared model, or the listed schema as it is; the description is the server's.
    assert by_name["crm_create_contact"].args_model is CreateContact
    assert by_name["crm_create_contact"].description == "Create a contact in the CRM."
    schema = by_name["crm_find_contact"].args_model.model_json_schema()
    assert schema == {"type": "object", "properties": {}}
    args = by_name["crm_find_contact"].args_model.model_validate({"email": "a@example.com"})
    assert args.model_dump(mode="json") == {"email": "a@example.com"}


def test_an_unsafe_guess_waits_for_approval_like_any_unsafe_tool() -> None:
    [tool] = mcp_tools(CRM, default=ToolPolicy(lease_ttl=TTL), listed=LISTED[:1])
    assert (tool.side_effect_class, tool.requires_approval) == (SideEffectClass.UNSAFE, True)


@pytest.mark.parametrize(
    ("tools", "default", "message"),
    [
        ({"create_contact": ToolPolicy(args=CreateContact)}, ToolPolicy(lease_ttl=TTL), "has no side_effect"),
        ({"create_contact": ToolPolicy(args=CreateContact)}, ToolPolicy(side_effect="fenced"), "has no lease_ttl"),
        ({"create_contact": ToolPolicy()}, ToolPolicy(side_effect="fenced", lease_ttl=TTL), "no argument schema"),
        (
            {"create_contact": ToolPolicy(side_effect="sometimes", args=CreateContact)},
            ToolPolicy(lease_ttl=TTL),
            "unknown side_effect",
        ),
        (
            {"a": ToolPolicy(name="x", args=CreateContact), "b": ToolPolicy(name="x", args=CreateContact)},
            ToolPolicy(side_effect="fenced", lease_ttl=TTL),
            "two MCP tools are declared as 'x'",
        ),
        (
            {"create_contact": ToolPolicy(args=CreateContact, renew_every=timedelta(0))},
            ToolPolicy(side_effect="fenced", lease_ttl=TTL),
            "renew_every must be above 0 and under lease_ttl",
        ),
        (
            {"create_contact": ToolPolicy(args=CreateContact, renew_every=TTL * 2)},
            ToolPolicy(side_effect="fenced", lease_ttl=TTL),
            "a lease renewed less often than its TTL lapses",
        ),
    ],
)
def test_a_declaration_that_cannot_be_leased_is_refused(
    tools: dict[str, ToolPolicy], default: ToolPolicy, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        mcp_tools(CRM, default=default, tools=tools)


def test_an_mcp_server_config_names_one_transport() -> None:
    assert MCPServer.http("crm", "http://127.0.0.1:8010/mcp").transport == "streamable-http"
    assert CRM.transport == "stdio"
    with pytest.raises(ConfigurationError, match="not both"):
        MCPServer("crm", command="python", url="http://127.0.0.1/mcp")
    with pytest.raises(ConfigurationError, match="MCP server name"):
        MCPServer.stdio("crm server", "python")
    with pytest.raises(ConfigurationError, match="an empty command or url"):
        MCPServer.stdio("crm", "")
    unnamed: list[list[Any]] = [[{}], [{"name": 3}], ["create_contact"]]
    for listed in unnamed:
        with pytest.raises(ConfigurationError, match="tools/list objects with a name"):
            mcp_tools(CRM, default=ToolPolicy(side_effect="fenced", lease_ttl=TTL), listed=listed)


def test_a_listing_file_that_never_ends_or_waits_for_a_writer_is_refused_in_one_line(tmp_path: Path) -> None:
    """``listed=`` a path: ``/dev/zero`` is refused once it passed the bound, a FIFO at once (it would wait for a
    writer), each as a ``ConfigurationError`` naming the file; nothing hangs or fills memory."""
    fifo = tmp_path / "crm.tools.json"
    os.mkfifo(fifo)
    policy = ToolPolicy(side_effect="fenced", lease_ttl=TTL)
    for path, why in ((Path("/dev/zero"), "larger than"), (fifo, "a FIFO")):
        with pytest.raises(ConfigurationError, match=f"cannot read the listed MCP tools from {path}: .*{why}"):
            mcp_tools(CRM, default=policy, listed=path)


def test_mcp_servers_and_toolsets_are_refused_in_one_line_naming_what_to_do() -> None:
    agents_server = MCPServerStdio(params={"command": "python", "args": ["-m", "crm_server"]}, name="crm")
    for refuse in (
        lambda: leased(agents_server, side_effect="fenced", lease_ttl=TTL),
        lambda: leased_tool(agents_server),  # type: ignore[arg-type]
        lambda: LeasedToolset([agents_server]),  # type: ignore[list-item]
        lambda: leased(CRM, side_effect="fenced", lease_ttl=TTL),
    ):
        with pytest.raises(ConfigurationError) as refused:
            refuse()
        message = str(refused.value)
        assert "\n" not in message and "agentlease.mcp.mcp_tools(" in message, message
    # Another kind of toolset is refused too, without the MCP advice.
    with pytest.raises(ConfigurationError, match=r"^LeasedToolset takes declared tools .*, not the FunctionToolset"):
        LeasedToolset([FunctionToolset()])  # type: ignore[list-item]


def test_the_expiry_is_written_in_utc() -> None:
    meta = lease_meta("k", 1, "r", datetime(2026, 1, 1, tzinfo=UTC))
    assert meta[LEASE_EXPIRES_AT_META] == "2026-01-01T00:00:00.000Z"


def test_a_listing_nested_past_pythons_stack_or_a_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    """JSON nested deeper than Python's parser recurses is a ``ConfigurationError``, not a ``RecursionError``; a
    directory is named by its path, not by the descriptor it was opened on."""
    deep = tmp_path / "deep.tools.json"
    deep.write_text("[" * 200_000)
    policy = ToolPolicy(side_effect="fenced", lease_ttl=TTL)
    with pytest.raises(ConfigurationError, match="RecursionError"):
        mcp_tools(CRM, default=policy, listed=deep)
    with pytest.raises(ConfigurationError, match=f"from {tmp_path}: Is a directory$"):
        mcp_tools(CRM, default=policy, listed=tmp_path)
