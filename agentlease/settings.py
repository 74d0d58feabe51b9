"""Settings: one ``AGENTLEASE_``-prefixed object.

Every field can be set from the environment (``AGENTLEASE_<FIELD>``) and every CLI flag maps to
one of these variables. Durations accept seconds (``"30"``) or ISO 8601 (``"PT30S"``).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agentlease.errors import ConfigurationError
from agentlease.limits import MAX_NAME_CHARS, MAX_TASK_QUEUE_CHARS
from agentlease.metrics import parse_address


class AgentLeaseSettings(BaseSettings):
    """Configuration of workers and the CLI.

    Attributes:
        temporal_address: Temporal frontend ``host:port``. Default ``localhost:7233``.
        namespace: Temporal namespace. Default ``default``.
        task_queue: task queue of agent runs and their tool calls. Default ``agentlease``.
        ledger_url: ``sqlite:///PATH`` (default ``sqlite:///.agentlease/ledger.db``) or
            ``postgresql://USER@HOST:PORT/DB``.
        tool_modules: comma-separated import paths of modules whose tools the worker registers.
        worker_identity: lease owner and Temporal identity; default ``<host>:<pid>``.
        shutdown_grace: how long running tools may finish after SIGTERM. Default 30s.
        max_concurrent_activities: tool calls one worker runs at once. Default 100.
        sticky_schedule_to_start: how long a run's next workflow task waits on the sticky queue of
            the worker that ran its last one before any worker may take it (Temporal's
            ``sticky_queue_schedule_to_start_timeout``): after that worker died or paused, the
            run moves on this much later. Default 3s.
        activity_pollers: long polls for tool calls one worker keeps open at most. A paused
            worker's open polls still take tasks, each one losing an attempt (a lease TTL), until
            the server's long poll expires; more polls serve more tool calls per second on a
            distant server. Default 1.
        workflow_pollers: long polls for workflow tasks one worker keeps open at most. Default 2.
        http_base_url: base for relative URLs of the built-in HTTP tools; ``http_get`` fetches only
            under it (its host, its path prefix) unless ``http_allowed_hosts`` names another host.
        http_allowed_hosts: further hosts (``host`` or ``host:port``) ``http_get`` may fetch from,
            comma-separated; default none (``docs/security.md``, "Tool authority").
        sql_target_url: database the ``sql_upsert`` tool writes into.
        sql_allowed_tables: the tables ``sql_upsert`` may write, comma-separated; default none,
            so every write is refused until a deployment names its tables.
        publish_base_url: base URL of the publishing service ``http_publish`` writes to.
        smtp_host: SMTP server ``smtp_send`` delivers to.
        smtp_port: its port. Default 25.
        data_dir: where ``demo`` and ``dev`` keep their files. Default ``.agentlease``.
        decision_timeout: how long ``approve``/``reject``/``reconcile``/``redrive``/``cancel`` wait
            for a worker to take the decision, and again for it to finish. Default 30s.
        metrics_address: ``HOST:PORT`` where a worker serves its lease metrics (Prometheus,
            ``GET /metrics``; see :mod:`agentlease.metrics`). Default unset: not served.
        plugins: ``module:attribute`` of Temporal client plugins (or of functions making them) to
            connect with, comma-separated: an agent framework's plugin, a tracing plugin.
        workflow_modules: modules whose ``@workflow.defn`` classes ``agentlease worker`` also serves
            (your agents' workflows), comma-separated.
        data_converter: ``module:attribute`` of the Temporal data converter (or a function making
            it); default the pydantic converter, or the one a plugin sets.
        ledger_pool_size: PostgreSQL connections one process (worker, sweeper) keeps to the ledger, at
            most; no overflow. Default 10. Size it so that workers x pool size (+ sweepers, CLI)
            stays under the server's ``max_connections`` (``docs/operations.md``).
        migrate_on_start: a worker brings the ledger schema to the newest revision when it starts.
            Default false: run ``agentlease db upgrade`` once per release, and a worker refuses to
            start on a schema it does not expect.
    """

    model_config = SettingsConfigDict(env_prefix="AGENTLEASE_", extra="ignore")

    temporal_address: str = "localhost:7233"
    namespace: str = Field(default="default", min_length=1, max_length=MAX_NAME_CHARS)
    task_queue: str = Field(default="agentlease", min_length=1, max_length=MAX_TASK_QUEUE_CHARS)
    ledger_url: str = "sqlite:///.agentlease/ledger.db"
    tool_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    worker_identity: str | None = None
    shutdown_grace: timedelta = Field(default=timedelta(seconds=30), ge=timedelta(0))
    max_concurrent_activities: int = Field(default=100, ge=1)
    sticky_schedule_to_start: timedelta = Field(default=timedelta(seconds=3), gt=timedelta(0))
    activity_pollers: int = Field(default=1, ge=1)
    workflow_pollers: int = Field(default=2, ge=2)
    http_base_url: str | None = None
    http_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    sql_target_url: str | None = None
    sql_allowed_tables: Annotated[list[str], NoDecode] = Field(default_factory=list)
    publish_base_url: str | None = None
    smtp_host: str | None = None
    smtp_port: int = Field(default=25, ge=1, le=65535)
    data_dir: Path = Path(".agentlease")
    metrics_address: str | None = None
    decision_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    plugins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    workflow_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_converter: str | None = None
    ledger_pool_size: int = Field(default=10, ge=1, le=1000)
    migrate_on_start: bool = False

    @field_validator("shutdown_grace", "decision_timeout", "sticky_schedule_to_start", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value  # ISO 8601 ("PT30S"), parsed by pydantic
        return value

    @field_validator("metrics_address", mode="before")
    @classmethod
    def _host_port(cls, value: object) -> object:
        if value == "":
            return None  # AGENTLEASE_METRICS_ADDRESS= (empty): not served
        if isinstance(value, str):
            try:
                parse_address(value)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("temporal_address")
    @classmethod
    def _temporal_host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
            raise ValueError(f"bad Temporal address {value!r}: expected HOST:PORT, e.g. localhost:7233")
        return value

    @field_validator(
        "tool_modules", "plugins", "workflow_modules", "http_allowed_hosts", "sql_allowed_tables", mode="before"
    )
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def default_identity() -> str:
    """``<hostname>:<pid>``: the lease owner and Temporal identity of this process, by default."""
    return f"{socket.gethostname()}:{os.getpid()}"
