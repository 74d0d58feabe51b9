"""Fixtures for tests against the real Temporal dev server (``temporal_address``, from ``tests/conftest.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.settings import AgentLeaseSettings


@pytest.fixture
async def client(temporal_address: str) -> AsyncIterator[Client]:
    yield await Client.connect(temporal_address, data_converter=pydantic_data_converter)


@pytest.fixture
def settings(temporal_address: str, sqlite_url: str) -> AgentLeaseSettings:
    """Settings of one test: a unique task queue and its own SQLite ledger."""
    return AgentLeaseSettings(
        temporal_address=temporal_address,
        task_queue=f"test-{uuid.uuid4().hex[:12]}",
        ledger_url=sqlite_url,
        tool_modules=["tests.integration.tools"],
        shutdown_grace=2,
    )
