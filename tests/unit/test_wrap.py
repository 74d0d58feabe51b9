"""Leasing existing tools as they are (``agentlease.leased``), and the lease outside a leased attempt."""

from __future__ import annotations

import asyncio
from dataclasses import FrozenInstanceError
from datetime import timedelta
from typing import Any

import pytest
from agents import FunctionTool, RunContextWrapper, function_tool
from google.adk.tools import FunctionTool as AdkFunctionTool
from google.adk.tools import ToolContext
from langchain_core.tools import tool as langchain_tool
from pydantic import BaseModel, ValidationError
from pydantic_ai import RunContext, Tool
from temporalio import activity

from agentlease import lease
from agentlease.enums import SideEffectClass
from agentlease.errors import AgentLeaseError, ConfigurationError, MissingHeartbeatTimeoutError
from agentlease.lease import NotInLeaseError
from agentlease.openai_agents import leased_tool
from agentlease.settings import AgentLeaseSettings
from agentlease.tools import LeaseContext, ToolResult, ToolSpec, leased, tool
from agentlease.tools._wrap import output_of

TTL = timedelta(seconds=10)


class Args(BaseModel):
    value: int = 0


class Address(BaseModel):
    city: str
    zip_code: str


async def refund(order_id: str, amount_cents: int = 100) -> dict[str, Any]:
    """Refund an order.

    Posts the refund to the refund service.
    """
    return {"order_id": order_id, "amount_cents": amount_cents, "in_lease": lease.in_lease()}


@activity.defn(name="lookup_order_v2")
async def lookup_order(order_id: str) -> int:
    """Look an order up."""
    return len(order_id)


def shipping_label(address: Address, /, copies: int = 1) -> str:
    """Print a shipping label (a sync function: it runs in a thread)."""
    return f"{copies}x {address.city} {address.zip_code}"


def test_a_plain_async_function_becomes_a_tool_with_its_signature_as_the_argument_model() -> None:
    spec = leased(refund, side_effect="fenced", lease_ttl=TTL)

    assert isinstance(spec, ToolSpec)
    assert (spec.name, spec.side_effect_class, spec.lease_ttl, spec.requires_approval) == (
        "refund",
        SideEffectClass.FENCED,
        TTL,
        False,
    )
    schema = spec.args_model.model_json_schema()
    assert schema["required"] == ["order_id"]
    assert schema["properties"]["amount_cents"] == {"default": 100, "title": "Amount Cents", "type": "integer"}
    assert schema["additionalProperties"] is False
    assert spec.description == "Refund an order.\n\nPosts the refund to the refund service."


def test_the_decorator_form_keeps_the_bounds_and_defaults_approval_for_unsafe_tools() -> None:
    @leased(side_effect="unsafe", lease_ttl=TTL, max_attempts=2, name="send_mail")
    async def mail(to: str) -> None:
        """Send one mail."""

    assert (mail.name, mail.max_attempts, mail.requires_approval) == ("send_mail", 2, True)
    assert mail.info().name == "send_mail"


async def test_a_leased_tool_called_directly_runs_the_function_without_a_lease() -> None:
    spec = leased(refund, side_effect="fenced", lease_ttl=TTL)

    assert await spec("A-1") == {"order_id": "A-1", "amount_cents": 100, "in_lease": False}
    assert await spec(order_id="A-2", amount_cents="7") == {"order_id": "A-2", "amount_cents": 7, "in_lease": False}
    with pytest.raises(ValidationError):
        await spec(order_id="A-3", amount_cents="lots")
    with pytest.raises(TypeError):
        await spec(order="A-4")


async def test_a_sync_function_with_a_positional_only_model_parameter_runs_in_a_thread() -> None:
    spec = leased(shipping_label, side_effect="read_only", lease_ttl=TTL)

    assert spec.args_model.model_json_schema()["required"] == ["address"]
    assert await spec({"city": "Lyon", "zip_code": "69001"}, copies=2) == "2x Lyon 69001"
    assert spec.description == "Print a shipping label (a sync function: it runs in a thread)."


async def test_an_activity_is_named_after_its_activity_whichever_decorator_comes_first() -> None:
    below = leased(lookup_order, side_effect="read_only", lease_ttl=TTL)
    assert below.name == "lookup_order_v2"
    assert await below(order_id="abc") == 3

    @activity.defn
    @leased(side_effect="read_only", lease_ttl=TTL)
    async def find_customer(email: str) -> str:
        return email.split("@")[1]

    assert isinstance(find_customer, ToolSpec)
    assert find_customer.name == "find_customer"
    assert await find_customer(email="a@example.com") == "example.com"

    with pytest.raises(ConfigurationError, match="put @leased"):

        @activity.defn(name="other_name")
        @leased(side_effect="read_only", lease_ttl=TTL)
        async def renamed(email: str) -> str:
            return email

    with pytest.raises(FrozenInstanceError):
        find_customer.name = "changed"  # type: ignore[misc]


async def test_a_pydantic_ai_tool_gives_its_function_name_and_description() -> None:
    async def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return f"sunny in {city}"

    spec = leased(Tool(get_weather, name="weather"), side_effect="read_only", lease_ttl=TTL)

    assert spec.name == "weather"
    assert spec.description == "The weather in a city."
    assert await spec(city="Oslo") == "sunny in Oslo"


def test_a_pydantic_ai_tool_that_takes_a_run_context_is_refused_in_one_line() -> None:
    async def with_ctx(ctx: RunContext[None], city: str) -> str:
        return city

    with pytest.raises(ConfigurationError, match="takes a RunContext, which only Pydantic AI can pass") as refused:
        leased(Tool(with_ctx), side_effect="read_only", lease_ttl=TTL)
    assert "\n" not in str(refused.value)


async def test_an_openai_function_tool_is_leased_through_the_function_it_wraps() -> None:
    @function_tool(name_override="issue_refund")
    async def refund_tool(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order through the refund service."""
        return {"refunded": order_id, "amount_cents": amount_cents}

    spec = leased(refund_tool, side_effect="idempotent", lease_ttl=TTL)

    assert spec.name == "issue_refund"
    assert spec.description == "Refund an order through the refund service."
    assert spec.args_model.model_json_schema()["required"] == ["order_id", "amount_cents"]
    assert await spec(order_id="A-1", amount_cents=5) == {"refunded": "A-1", "amount_cents": 5}


def test_an_openai_function_tool_without_its_function_or_taking_a_context_is_refused() -> None:
    async def invoke(ctx: Any, arguments: str) -> str:
        return arguments

    bare = FunctionTool(name="bare", description="", params_json_schema={}, on_invoke_tool=invoke)
    with pytest.raises(ConfigurationError, match="pass the undecorated function"):
        leased(bare, side_effect="read_only", lease_ttl=TTL)

    @function_tool
    async def with_context(ctx: RunContextWrapper[Any], order_id: str) -> str:
        return order_id

    with pytest.raises(ConfigurationError, match="takes a RunContextWrapper"):
        leased(with_context, side_effect="read_only", lease_ttl=TTL)


async def test_a_langchain_tool_and_an_adk_function_tool_are_leased_through_their_functions() -> None:
    """LangGraph's ``@tool`` and ADK's ``FunctionTool`` keep their names and descriptions; an ADK function taking a
    ``ToolContext`` is refused in one line (only ADK passes one)."""

    async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order through the refund service."""
        return {"refunded": order_id, "amount_cents": amount_cents}

    for framework_tool in (langchain_tool(issue_refund), AdkFunctionTool(issue_refund)):
        spec = leased(framework_tool, side_effect="idempotent", lease_ttl=TTL)
        assert (spec.name, spec.description) == ("issue_refund", "Refund an order through the refund service.")
        assert spec.args_model.model_json_schema()["required"] == ["order_id", "amount_cents"]
        assert await spec(order_id="A-1", amount_cents=5) == {"refunded": "A-1", "amount_cents": 5}

    async def with_context(order_id: str, tool_context: ToolContext) -> str:
        return order_id

    with pytest.raises(ConfigurationError, match="takes a ToolContext") as refused:
        leased(AdkFunctionTool(with_context), side_effect="read_only", lease_ttl=TTL)
    assert "\n" not in str(refused.value)


def test_what_cannot_be_leased_as_it_is_is_refused() -> None:
    async def takes_lease(ctx: LeaseContext, order_id: str) -> str:
        return order_id

    async def variadic(*order_ids: str) -> str:
        return ""

    async def opaque(lock: asyncio.Lock) -> None:
        return None

    declared = leased(refund, side_effect="read_only", lease_ttl=TTL)
    cases: list[tuple[Any, str]] = [
        (takes_lease, "takes a LeaseContext"),
        (variadic, r"\*order_ids cannot be leased"),
        (opaque, "cannot be validated"),
        (declared, "already declared"),
        (42, "not a function"),
    ]
    for target, why in cases:
        with pytest.raises(ConfigurationError, match=why):
            leased(target, side_effect="read_only", lease_ttl=TTL)


def test_leased_shares_the_declaration_rules_of_tool() -> None:
    with pytest.raises(ConfigurationError, match="unknown side_effect 'sometimes'"):
        leased(refund, side_effect="sometimes", lease_ttl=TTL)
    with pytest.raises(MissingHeartbeatTimeoutError, match="heartbeat_timeout"):
        leased(refund, side_effect="read_only", lease_ttl=timedelta(0))
    with pytest.raises(ConfigurationError, match="start_to_close"):
        leased(refund, side_effect="read_only", lease_ttl=timedelta(minutes=10))
    with pytest.raises(ConfigurationError, match="max_attempts"):
        leased(refund, side_effect="read_only", lease_ttl=TTL, max_attempts=0)


def test_a_tool_declared_with_tool_is_not_callable_outside_its_lease() -> None:
    @tool(side_effect="read_only", lease_ttl=TTL)
    async def declared(ctx: LeaseContext, args: Args) -> ToolResult:
        """Declared the long way."""
        raise NotImplementedError

    assert declared.description == "Declared the long way."
    with pytest.raises(ConfigurationError, match="runs only as a leased activity"):
        declared(value=1)


async def test_the_lease_is_not_there_outside_a_leased_attempt() -> None:
    assert lease.in_lease() is False
    for reach in (lease.context, lease.fencing_token, lease.idempotency_key, lease.downstream_headers):
        with pytest.raises(NotInLeaseError, match="outside a leased tool call"):
            reach()
    with pytest.raises(NotInLeaseError):
        await lease.advance("commit", "writing")
    with pytest.raises(NotInLeaseError):
        await lease.renew("still writing")
    with pytest.raises(NotInLeaseError):
        lease.receipt("refunds", "r-1", "refunded")
    assert issubclass(NotInLeaseError, RuntimeError) and issubclass(NotInLeaseError, AgentLeaseError)


def test_the_output_an_agent_reads_is_a_json_object() -> None:
    assert output_of({"ok": True}) == {"ok": True}
    assert output_of(Address(city="Lyon", zip_code="69001")) == {"city": "Lyon", "zip_code": "69001"}
    assert output_of(3) == {"result": 3}
    assert output_of(None) == {"result": None}
    assert output_of(["a", timedelta(seconds=1)]) == {"result": ["a", "PT1S"]}
    assert output_of({"lock": object})["lock"].startswith("<class")


def test_the_openai_adapter_reads_the_wrapped_function_s_docstring_and_argument_model() -> None:
    spec = leased(refund, side_effect="fenced", lease_ttl=TTL)

    function = leased_tool(spec)

    assert function.name == "refund"
    assert function.description == "Refund an order."
    # The model's schema is the argument model's, made strict by the SDK (every property listed as required).
    schema = spec.args_model.model_json_schema()
    assert function.params_json_schema["properties"] == schema["properties"]
    assert set(function.params_json_schema["required"]) == set(schema["properties"])


def test_a_bad_tool_name_and_worker_only_settings_are_refused_at_declaration() -> None:
    """A tool named outside the alphabet, too long, or as one of agentlease's own activities (the worker used to
    die at start with a traceback), and a tool declaring the worker's own settings: refused in one line."""

    async def lookup(order_id: str) -> str:
        return order_id

    for name in ("", "a b/c", "x" * 129, "agentlease.apply_decision", "1st", "naïve"):
        with pytest.raises(ConfigurationError, match="bad tool name") as refused:
            leased(lookup, side_effect="read_only", lease_ttl=TTL, name=name)
        assert "\n" not in str(refused.value)
    with pytest.raises(ConfigurationError, match="codec_keys, ledger_url, which only the worker reads"):
        leased(lookup, side_effect="read_only", lease_ttl=TTL, settings=("ledger_url", "codec_keys"))
    assert (
        leased(lookup, side_effect="read_only", lease_ttl=TTL, name="crm.lookup-order_2").name == "crm.lookup-order_2"
    )


def test_an_approval_ttl_beyond_thirty_days_is_refused() -> None:
    async def refund(order_id: str) -> str:
        return order_id

    with pytest.raises(ConfigurationError, match="approval_ttl must be a positive timedelta of at most 30 days"):
        leased(refund, side_effect="fenced", lease_ttl=TTL, approval_ttl=timedelta(days=31))
    with pytest.raises(ValidationError, match="less than or equal to 30 days"):
        AgentLeaseSettings(approval_ttl=timedelta(seconds=1e12))
