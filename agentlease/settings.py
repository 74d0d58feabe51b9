"""Settings: one ``AGENTLEASE_``-prefixed object, every CLI flag one of its variables (``docs/settings.md``).

Durations accept seconds (``"30"``) or ISO 8601 (``"PT30S"``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agentlease.errors import ConfigurationError, describe_validation_error, one_line
from agentlease.limits import MAX_APPROVAL_TTL, MAX_NAME_CHARS, MAX_TASK_QUEUE_CHARS, is_decimal


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, all interfaces) as ``(host, port)``; ``ConfigurationError`` if not."""
    host, sep, port = address.rpartition(":")
    if not sep or not is_decimal(port) or int(port) > 65535:
        raise ConfigurationError(f"bad metrics address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def load_object(path: str, what: str, *, factory: bool = True) -> Any:
    """The object named ``module:attribute``; a function there is called (a factory, no arguments) unless
    ``factory`` is false (a redactor). ``ConfigurationError``: not ``module:attribute``, or it cannot be loaded."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"bad {what} {path!r}: expected module:attribute")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {what} {path!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the module failed while importing: a bad setting, in one line
        raise ConfigurationError(f"cannot load {what} {path!r}: importing it raised {type(exc).__name__}") from None
    if not (factory and inspect.isfunction(value)):
        return value
    try:
        return value()  # a factory: ``def plugin() -> Plugin``
    except Exception as exc:  # noqa: BLE001 - a factory that fails, or takes arguments: a bad setting
        raise ConfigurationError(
            f"cannot load {what} {path!r}: calling it raised {type(exc).__name__}: {one_line(exc)}"
        ) from None


class AgentLeaseSettings(BaseSettings):
    """Configuration of workers and the CLI: the one home of every setting, each read from ``AGENTLEASE_<FIELD>``.

    Each field's ``description`` is its documentation: the CLI's flags and ``docs/settings.md`` are made from them.
    """

    model_config = SettingsConfigDict(env_prefix="AGENTLEASE_", extra="ignore")

    # Connections
    temporal_address: str = Field(default="localhost:7233", description="Temporal frontend `HOST:PORT`.")
    namespace: str = Field(
        default="default", min_length=1, max_length=MAX_NAME_CHARS, description="Temporal namespace."
    )
    task_queue: str = Field(
        default="agentlease",
        min_length=1,
        max_length=MAX_TASK_QUEUE_CHARS,
        description="Task queue of agent runs and their tool calls.",
    )
    ledger_url: str = Field(
        default="sqlite:///.agentlease/ledger.db",
        description="The ledger: `sqlite:///PATH` or `postgresql://USER:PASS@HOST:PORT/DB` (`postgres://` too), "
        "with `?sslmode=...&connect_timeout=...&application_name=...` as libpq takes them (docs/operations.md).",
    )
    ledger_pool_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="PostgreSQL connections one process (worker, sweeper) keeps to the ledger, at most; no "
        "overflow. Keep workers x pool size (+ sweepers, CLI) under the server's `max_connections`.",
    )
    migrate_on_start: bool = Field(
        default=False,
        description="A worker brings the ledger schema to the newest revision when it starts. Off: run "
        "`agentlease db upgrade` once per release; a worker refuses a schema it does not expect.",
    )
    tool_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Modules whose tools the worker registers, comma-separated import paths."
    )
    workflow_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Modules whose `@workflow.defn` classes `agentlease worker` also serves (your agents' "
        "workflows), comma-separated.",
    )
    plugins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="`module:attribute` of Temporal client plugins (or of functions making them), "
        "comma-separated: an agent framework's plugin, a tracing plugin.",
    )
    data_converter: str | None = Field(
        default=None,
        description="`module:attribute` of the Temporal data converter (or a function making it). Unset: the "
        "pydantic converter, or the one a plugin sets.",
    )
    data_dir: Path = Field(default=Path(".agentlease"), description="Where `demo` and `dev` keep their files.")

    # The worker
    worker_identity: str | None = Field(
        default=None, description="Lease owner and Temporal identity. Unset: `HOST:PID`."
    )
    shutdown_grace: timedelta = Field(
        default=timedelta(seconds=30),
        ge=timedelta(0),
        description="How long running tools may finish after SIGTERM, in seconds.",
    )
    max_concurrent_activities: int = Field(default=100, ge=1, description="Tool calls one worker runs at once.")
    sticky_schedule_to_start: timedelta = Field(
        default=timedelta(seconds=3),
        gt=timedelta(0),
        description="Seconds a run's next workflow task waits on the sticky queue of the worker that ran its "
        "last one before any worker may take it (after that worker died or paused).",
    )
    activity_pollers: int = Field(
        default=1,
        ge=1,
        description="Long polls for tool calls one worker keeps open at most. A paused worker's open polls "
        "still take tasks, each losing one lease TTL, until the server's long poll expires.",
    )
    workflow_pollers: int = Field(
        default=2, ge=2, description="Long polls for workflow tasks one worker keeps open at most (sticky and normal)."
    )
    metrics_address: str | None = Field(
        default=None,
        description="`HOST:PORT` where `worker`, `sweep`, `dev` and `demo` serve `GET /metrics` (Prometheus "
        "lease metrics). Unset: not served.",
    )
    temporal_metrics: bool = Field(
        default=True,
        description="With a metrics address, a worker also serves Temporal's runtime metrics (`temporal_*`).",
    )
    tracing: bool = Field(
        default=False,
        description="Trace ledger operations with OpenTelemetry inside Temporal's activity spans, exported as "
        "the `OTEL_*` variables say (needs `agentlease[otel]`).",
    )

    # The built-in tools
    http_base_url: str | None = Field(
        default=None,
        description="Base of the built-in HTTP tools' relative URLs; `http_get` fetches only under it unless "
        "the allowed hosts name another host.",
    )
    http_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Further hosts (`host` or `host:port`) `http_get` may fetch from, comma-separated.",
    )
    sql_target_url: str | None = Field(default=None, description="Database the `sql_upsert` tool writes into.")
    sql_allowed_tables: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Tables `sql_upsert` may write, comma-separated. Empty: every write is refused (`dev` and "
        "`demo` allow their `inventory`).",
    )
    publish_base_url: str | None = Field(
        default=None, description="Base URL of the publishing service `http_publish` writes to."
    )
    smtp_host: str | None = Field(default=None, description="SMTP server `smtp_send` delivers to.")
    smtp_port: int = Field(default=25, ge=1, le=65535, description="Port of the SMTP server.")

    # Operators and decisions
    decision_timeout: timedelta = Field(
        default=timedelta(seconds=30),
        gt=timedelta(0),
        description="Seconds `approve`, `reject`, `reconcile`, `redrive`, `cancel` and `status` wait for a "
        "worker to take the decision, and again for it to finish.",
    )
    decision_mode: Literal["open", "authenticated"] = Field(
        default="open",
        description="`open` (`--by` names the operator, as typed) or `authenticated` (every operator "
        "decision is signed by a key of the operator keys).",
    )
    operator: str | None = Field(
        default=None, description="Who decides, kept in the evidence trail; with an operator key, the key's operator."
    )
    operator_keys: str | None = Field(
        default=None,
        description="The workers' operator public keys, `NAME=KEY` comma-separated, KEY a `.pub` file written "
        "by `agentlease keys new-operator` or its base64 text.",
    )
    operator_key: Path | None = Field(
        default=None,
        description="The CLI's operator private key file: decisions are signed with it and name its operator.",
    )
    decision_max_age: timedelta = Field(
        default=timedelta(minutes=15),
        gt=timedelta(0),
        description="Seconds a signed decision stays valid for a worker to apply it.",
    )
    approval_ttl: timedelta = Field(
        default=timedelta(hours=1),
        gt=timedelta(0),
        le=MAX_APPROVAL_TTL,
        description="Seconds an approval of a call stays valid, on the ledger's clock, for a tool that declares "
        "no `approval_ttl` of its own: a claim after that is refused and the call waits to be approved again.",
    )
    approval_warning: timedelta = Field(
        default=timedelta(minutes=5),
        gt=timedelta(0),
        le=MAX_APPROVAL_TTL,
        description="Seconds before an approval not yet consumed lapses that the sweeper warns of it, once: an "
        "`approval_expiring` entry in the trail and `agentlease_approvals_expiring_total`.",
    )

    # Transport, payloads and secrets
    temporal_tls: bool = Field(default=False, description="TLS to Temporal with the system's CAs.")
    temporal_tls_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA that signed Temporal's certificate; setting it (or a client "
        "certificate) turns TLS on.",
    )
    temporal_tls_cert_file: Path | None = Field(
        default=None, description="PEM client certificate (mTLS), with the client key."
    )
    temporal_tls_key_file: Path | None = Field(
        default=None, description="PEM client private key (mTLS), with the client certificate."
    )
    temporal_tls_server_name: str | None = Field(
        default=None,
        description="Name the server's certificate is checked against. Unset: the host of the Temporal address.",
    )
    temporal_api_key: str | None = Field(
        default=None, repr=False, description="API key sent with every call to Temporal (turns TLS on)."
    )
    codec_keys: str | None = Field(
        default=None,
        repr=False,
        description="Payload encryption keys, `ID:BASE64KEY` comma-separated (16, 24 or 32-byte AES-GCM keys); "
        "the first encrypts, every one decrypts. Unset: payloads are plain JSON.",
    )
    payload_codec: str | None = Field(
        default=None, description="`module:attribute` of another payload codec (or a function making it)."
    )
    fencing_key: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="Key fencing tokens are signed with (`GENERATION.SIGNATURE`), shared with the downstreams "
        "that verify them; 16 characters or more. Unset: bare generations.",
    )
    redactor: str | None = Field(
        default=None,
        description="`module:function` `(text) -> text` applied to everything the ledger stores. Unset: "
        "`agentlease.security.redaction.redact_text`.",
    )
    secret_provider: str | None = Field(
        default=None,
        description="`module:attribute` of the tools' secret provider, with `get(tool, name)` (or a function "
        "making it). Unset: the variables `AGENTLEASE_SECRET_<TOOL>__<NAME>`.",
    )

    # The web servers
    ui_host: str = Field(default="127.0.0.1", description="Address `agentlease ui` serves on.")
    ui_port: int = Field(default=8080, ge=0, le=65535, description="Port `agentlease ui` serves on.")
    temporal_ui: str | None = Field(
        default=None, description="The Temporal UI's address, for the web view's links to each run."
    )
    ui_token: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="Token `agentlease ui` requires of every request (`Authorization: Bearer TOKEN`, or a "
        "browser's password prompt); needed to serve on any address but loopback. 16 characters or more.",
    )
    ui_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Further host names (`Host` header) `agentlease ui` answers to, comma-separated, beside "
        "loopback, its own address and this machine's names; any other is refused (DNS rebinding).",
    )
    codec_server_host: str = Field(default="127.0.0.1", description="Address `agentlease codec-server` serves on.")
    codec_server_port: int = Field(
        default=8081, ge=0, le=65535, description="Port `agentlease codec-server` serves on."
    )
    codec_server_token: str | None = Field(
        default=None,
        repr=False,
        description="Bearer token the codec server requires. Unset: anyone who reaches it may decode.",
    )
    codec_server_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://localhost:8233"],
        description="Browser origins allowed to call the codec server (CORS), comma-separated.",
    )

    @field_validator(
        "shutdown_grace",
        "decision_timeout",
        "sticky_schedule_to_start",
        "decision_max_age",
        "approval_ttl",
        "approval_warning",
        mode="before",
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
        if not sep or not host or not is_decimal(port) or not 0 < int(port) <= 65535:
            raise ValueError(f"bad Temporal address {value!r}: expected HOST:PORT, e.g. localhost:7233")
        return value

    @field_validator(
        "tool_modules",
        "plugins",
        "workflow_modules",
        "codec_server_origins",
        "http_allowed_hosts",
        "sql_allowed_tables",
        "ui_allowed_hosts",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        parts = [part.strip() for part in value.split(",") if part.strip()]
        return [part.lower() for part in parts] if info.field_name == "ui_allowed_hosts" else parts


def env_var(name: str) -> str:
    """The environment variable of the setting ``name``: ``AGENTLEASE_<NAME>``."""
    return f"AGENTLEASE_{name.upper()}"


def settings_error(exc: ValidationError) -> ConfigurationError:
    """The one-line error of settings that do not validate, each named by its variable (the name the user set,
    whether through the variable or its flag): ``bad setting: AGENTLEASE_APPROVAL_TTL: Input should be ...``."""
    return ConfigurationError(f"bad setting: {describe_validation_error(exc, field=env_var)}")


def default_text(name: str) -> str:
    """The default of the setting ``name`` as the CLI's help and ``docs/settings.md`` show it."""
    field = AgentLeaseSettings.model_fields[name]
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, list):
        return ",".join(value) or "none"
    return str(value)


def default_identity() -> str:
    """``<hostname>:<pid>``: the lease owner and Temporal identity of this process, by default."""
    return f"{socket.gethostname()}:{os.getpid()}"


def with_overrides(settings: AgentLeaseSettings, overrides: dict[str, Any]) -> AgentLeaseSettings:
    """``settings`` with a command's own options (``None``: not given), validated like the rest
    (``ConfigurationError``)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return settings
    try:
        return AgentLeaseSettings.model_validate({**settings.model_dump(), **given})
    except ValidationError as exc:
        raise settings_error(exc) from None
