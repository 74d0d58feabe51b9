"""Search attributes of agent runs, so operators find the work that waits for them in the
Temporal UI (``AgentLeaseWaitingReason != ""``) and with ``temporal workflow list --query``.

``agentlease dev``, ``agentlease demo`` and the tests register them on the dev server. On a
production namespace create them once::

    temporal operator search-attribute create --namespace NS \\
        --name AgentLeaseStatus --type Keyword --name AgentLeaseWaitingReason --type Keyword \\
        --name AgentLeaseTool --type Keyword --name AgentLeaseStage --type Keyword \\
        --name AgentLeaseGeneration --type Int --name AgentLeaseOwner --type Keyword \\
        --name AgentLeaseDecision --type Keyword

``docs/operator-views.md`` says what each shows, and when it changes.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

RUN_STATUS = SearchAttributeKey.for_keyword("AgentLeaseStatus")
"""``starting``, ``running``, ``waiting``, ``completed``, ``cancelled``, ``failed``."""
WAITING_REASON = SearchAttributeKey.for_keyword("AgentLeaseWaitingReason")
"""Empty, or ``<step>: <status>`` of each task waiting for a person (approval, reconciliation...), comma-separated."""
CURRENT_TOOL = SearchAttributeKey.for_keyword("AgentLeaseTool")
"""The tool of the step being worked on."""
CURRENT_STAGE = SearchAttributeKey.for_keyword("AgentLeaseStage")
"""The last stage the run knows of for that step (live: the leased activity signals each stage it records)."""
CURRENT_GENERATION = SearchAttributeKey.for_int("AgentLeaseGeneration")
"""The claim generation of the step's current lease, as the ledger minted it."""
CURRENT_OWNER = SearchAttributeKey.for_keyword("AgentLeaseOwner")
"""The ``lease_owner`` (worker identity) holding that step's lease."""
LAST_DECISION = SearchAttributeKey.for_keyword("AgentLeaseDecision")
"""The run's last operator decision: ``<step>: <approved|rejected|...> by <who>: <why>`` (at most 250 characters)."""

ALL = (RUN_STATUS, WAITING_REASON, CURRENT_TOOL, CURRENT_STAGE, CURRENT_GENERATION, CURRENT_OWNER, LAST_DECISION)
BY_NAME = {key.name: key for key in ALL}


def type_name(key: SearchAttributeKey[Any]) -> str:
    """The type of ``key`` as the ``temporal`` CLI spells it: ``Keyword``, ``Int``."""
    return (
        IndexedValueType.Name(IndexedValueType.ValueType(key.indexed_value_type.value))
        .removeprefix("INDEXED_VALUE_TYPE_")
        .capitalize()
    )


def dev_server_flags() -> list[str]:
    """``temporal server start-dev`` flags that register every attribute with its type."""
    return [flag for key in ALL for flag in ("--search-attribute", f"{key.name}={type_name(key)}")]


async def ensure_registered(client: Client, namespace: str) -> str | None:
    """Register the missing attributes on ``namespace`` (best effort, for dev servers and clusters
    where workers may administer their namespace).

    Returns:
        ``None`` when all attributes exist afterwards; otherwise one line saying why they could not
        be registered (the caller logs it; runs then fail their first workflow task until an
        operator creates them).
    """
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        missing = {key.name for key in ALL} - set(existing.custom_attributes)
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={
                        name: IndexedValueType.ValueType(BY_NAME[name].indexed_value_type.value)
                        for name in sorted(missing)
                    },
                )
            )
    except RPCError as exc:
        return f"cannot register search attributes {', '.join(k.name for k in ALL)} on {namespace}: {exc.message}"
    return None
