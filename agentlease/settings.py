"""Settings: one ``AGENTLEASE_``-prefixed object.

Every field can be set from the environment (``AGENTLEASE_<FIELD>``) and every CLI flag maps to
one of these variables. Durations accept seconds (``"30"``) or ISO 8601 (``"PT30S"``).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agentlease.errors import ConfigurationError, describe_validation_error
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
        tracing: trace ledger operations with OpenTelemetry inside Temporal's activity spans, the
            exporter set by the standard ``OTEL_*`` variables (needs ``agentlease[otel]``;
            ``docs/tracing.md``). Default false.
        temporal_metrics: with ``metrics_address``, a worker also serves Temporal's runtime metrics
            (``temporal_*``) on the same endpoint (``docs/metrics.md``). Default true.
        migrate_on_start: a worker brings the ledger schema to the newest revision when it starts.
            Default false: run ``agentlease db upgrade`` once per release, and a worker refuses to
            start on a schema it does not expect.
        temporal_tls_ca_file: PEM file of the CA that signed the Temporal frontend's certificate;
            setting it (or a client certificate) turns TLS on. Default unset: plain TCP.
        temporal_tls_cert_file / temporal_tls_key_file: PEM client certificate and key (mTLS), both
            or neither.
        temporal_tls_server_name: the name to check the server's certificate against; default the
            host of ``temporal_address``.
        temporal_tls: TLS with the system's CAs (Temporal Cloud with an API key). Default false.
        temporal_api_key: API key sent with every call (turns TLS on, as Temporal Cloud needs).
        codec_keys: payload encryption keys, ``ID:BASE64KEY`` comma-separated (16, 24 or 32-byte
            AES keys); the first encrypts, every one decrypts (key rotation). Default unset: payloads
            are stored as plain JSON. See ``docs/security.md``.
        payload_codec: ``module:attribute`` of another payload codec (or a function making it).
        codec_server_token: bearer token the codec server (``agentlease codec-server``) requires;
            default unset: anyone who reaches it may decode.
        codec_server_origins: browser origins allowed to call the codec server (CORS),
            comma-separated. Default the local Temporal UI, ``http://localhost:8233``.
        decision_mode: ``open`` (default: ``--by`` names the operator, as typed) or
            ``authenticated`` (every operator decision must be signed by a key of
            ``operator_keys``). See ``docs/security.md``, "Authenticated decisions".
        operator_keys: the workers' operator public keys, ``NAME=KEY`` comma-separated, KEY a
            ``.pub`` file written by ``agentlease keys new-operator`` or its base64 text.
        operator_key: the CLI's operator private key file; decisions are signed with it and name
            its operator.
        decision_max_age: how old a signed decision may be when a worker applies it. Default 15m.
        redactor: ``module:attribute`` of the function ``(text) -> text`` applied to everything the
            ledger stores (reasons, errors, receipts, evidence); default
            :func:`agentlease.redaction.redact_text`.
        secret_provider: ``module:attribute`` of the tools' secret provider (or a function making
            it); default :class:`agentlease.secrets.EnvSecretProvider`.
        fencing_key: the key fencing tokens are signed with (``<generation>.<signature>``), shared
            with the downstreams that verify them; at least 16 characters. Default unset: workers send
            bare generations (``docs/security.md``, "Fencing tokens a downstream can verify").
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
    temporal_tls_ca_file: Path | None = None
    temporal_tls_cert_file: Path | None = None
    temporal_tls_key_file: Path | None = None
    temporal_tls_server_name: str | None = None
    temporal_tls: bool = False
    temporal_api_key: str | None = Field(default=None, repr=False)
    codec_keys: str | None = Field(default=None, repr=False)
    payload_codec: str | None = None
    codec_server_token: str | None = Field(default=None, repr=False)
    codec_server_origins: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["http://localhost:8233"])
    decision_mode: Literal["open", "authenticated"] = "open"
    operator_keys: str | None = None
    operator_key: Path | None = None
    decision_max_age: timedelta = Field(default=timedelta(minutes=15), gt=timedelta(0))
    redactor: str | None = None
    secret_provider: str | None = None
    tracing: bool = False
    temporal_metrics: bool = True
    fencing_key: SecretStr | None = Field(default=None, min_length=16)

    @field_validator(
        "shutdown_grace", "decision_timeout", "sticky_schedule_to_start", "decision_max_age", mode="before"
    )
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
        "tool_modules",
        "plugins",
        "workflow_modules",
        "codec_server_origins",
        "http_allowed_hosts",
        "sql_allowed_tables",
        mode="before",
    )
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def default_identity() -> str:
    """``<hostname>:<pid>``: the lease owner and Temporal identity of this process, by default."""
    return f"{socket.gethostname()}:{os.getpid()}"


def with_overrides(settings: AgentLeaseSettings, overrides: dict[str, Any]) -> AgentLeaseSettings:
    """``settings`` with a command's own options (``None``: not given), validated like the rest.

    Raises:
        ConfigurationError: an option's value does not validate.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return settings
    try:
        return AgentLeaseSettings.model_validate({**settings.model_dump(), **given})
    except ValidationError as exc:
        raise ConfigurationError(f"bad setting: {describe_validation_error(exc)}") from None
