"""Fixtures of the attack tests: the real Temporal dev server, a ledger on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import Worker

from agentlease.ledger.store import Ledger
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from tests.integration.conftest import client, settings

__all__ = ["client", "settings"]


@pytest.fixture
def attack_settings(temporal_address: str, ledger_url: str) -> AgentLeaseSettings:
    """One test's attack_settings: a unique task queue, its own ledger (SQLite, then PostgreSQL)."""
    return AgentLeaseSettings(
        temporal_address=temporal_address,
        task_queue=f"sec-{uuid.uuid4().hex[:12]}",
        ledger_url=ledger_url,
        tool_modules=["tests.security.tools"],
        shutdown_grace=2,
    )


@asynccontextmanager
async def victim_worker(client: Client, ledger: Ledger, attack_settings: AgentLeaseSettings) -> AsyncIterator[Worker]:
    """The deployment's worker on the task queue (a client and runtime of its own, like a separate host)."""
    own_client = await Client.connect(
        client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig()),
        identity="victim-worker",
    )
    worker = build_worker(
        own_client, ledger, load_registry(attack_settings.tool_modules), attack_settings, identity="victim-worker"
    )
    async with worker:
        yield worker
