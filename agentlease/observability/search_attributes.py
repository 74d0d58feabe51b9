"""Search attributes of agent runs, so operators find waiting work in the Temporal UI (``AgentLeaseWaitingReason
!= ""``); a worker registers the missing ones (:func:`require_registered`). ``docs/operator-views.md``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from agentlease.errors import ConfigurationError

logger = logging.getLogger("agentlease.observability.search_attributes")

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

REFUSED_WRITES = SearchAttributeKey.for_int("AgentLeaseRefusedWrites")
"""How many late holder writes the ledger refused on the run's tasks, as the run learnt them; unset until one."""

ALL = (
    *(RUN_STATUS, WAITING_REASON, CURRENT_TOOL, CURRENT_STAGE),
    *(CURRENT_GENERATION, CURRENT_OWNER, LAST_DECISION, REFUSED_WRITES),
)
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


def create_command(namespace: str, names: Iterable[str] | None = None) -> str:
    """The ``temporal`` command that creates ``names`` (default every attribute) on ``namespace``."""
    keys: list[SearchAttributeKey[Any]] = [BY_NAME[name] for name in sorted(names)] if names is not None else [*ALL]
    flags = " ".join(f"--name {key.name} --type {type_name(key)}" for key in keys)
    return f"temporal operator search-attribute create --namespace {namespace} {flags}"


async def missing_on(client: Client, namespace: str) -> list[str]:
    """The attributes ``namespace`` lacks, by name; RPCError when this client may not list them."""
    existing = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    return sorted({key.name for key in ALL} - set(existing.custom_attributes))


async def require_registered(client: Client, namespace: str, *, register: bool = True) -> None:
    """Make sure every attribute exists on ``namespace`` before a worker polls (else every workflow task fails
    with ``BadSearchAttributes``): ``register`` adds the missing ones; false only checks, trusting the
    operator when the worker may not list them.

    Raises:
        ConfigurationError: one line naming the missing attributes and the command that creates them.
    """
    try:
        missing = await missing_on(client, namespace)
    except RPCError as exc:
        if not register:
            logger.warning("cannot list the search attributes of %s (%s); trusting they exist", namespace, exc.message)
            return
        raise ConfigurationError(
            f"cannot list the search attributes of namespace {namespace} ({exc.message}); create them once with "
            f"`{create_command(namespace)}`, then pass AgentLeasePlugin(register_search_attributes=False)"
        ) from None
    if not missing:
        return
    problem = f"search attributes {', '.join(missing)} are missing on namespace {namespace}"
    if register:
        types = {name: IndexedValueType.ValueType(BY_NAME[name].indexed_value_type.value) for name in missing}
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=types)
            )
            logger.info("registered search attributes %s on %s", ", ".join(missing), namespace)
            return
        except RPCError as exc:
            problem += f" and this worker may not register them ({exc.message})"
    raise ConfigurationError(f"{problem}; create them once with `{create_command(namespace, missing)}`")
