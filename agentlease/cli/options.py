"""The CLI's settings flags, made from :class:`~agentlease.settings.AgentLeaseSettings`: a flag's help, variable
(``AGENTLEASE_<NAME>``) and default are its field's; this module says which command carries it and, for a few, a
shorter spelling. ``python -m agentlease.cli.options docs/settings.md`` rewrites the docs' table from the same fields.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from agentlease.settings import AgentLeaseSettings, default_text, env_var, settings_error, with_overrides

SECURE = "Transport, payloads and signed decisions"
"""The ``--help`` panel of the global TLS, API key, codec and operator key flags."""


@dataclass(frozen=True)
class Flag:
    """One ``setting`` (a field of :class:`AgentLeaseSettings`) as a command's flag, spelt ``name`` (default
    ``--<setting>`` with dashes, ``--x/--no-x`` for a bool), in the ``--help`` ``panel`` (default the options)."""

    setting: str
    name: str | None = None
    panel: str | None = None

    @property
    def spelling(self) -> str:
        if self.name is not None:
            return self.name
        dashed = "--" + self.setting.replace("_", "-")
        return f"{dashed}/--no-{dashed[2:]}" if _kind(self.setting) is bool else dashed

    def option(self) -> Any:
        """The typer annotation of this flag: ``Annotated[T | None, typer.Option(...)]``."""
        field = AgentLeaseSettings.model_fields[self.setting]
        help_text = (field.description or "").replace("`", "")
        if field.get_default(call_default_factory=True) is not None:
            help_text += f" Default {default_text(self.setting)}."
        option = typer.Option(self.spelling, envvar=env_var(self.setting), help=help_text, rich_help_panel=self.panel)
        return Annotated[_kind(self.setting) | None, option]


def _kind(setting: str) -> type:
    """The flag's value type: seconds for a duration, the field's own for bool, int, Path; else text."""
    annotation = AgentLeaseSettings.model_fields[setting].annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if len(args) == 1 and typing.get_origin(annotation) is not Annotated else annotation
    if base is timedelta:
        return float
    return base if base in (bool, int, Path) else str  # type: ignore[return-value]


GLOBAL = (
    *map(Flag, ("temporal_address", "namespace", "task_queue", "ledger_url", "tool_modules", "data_dir")),
    Flag("decision_timeout"),
    Flag("temporal_tls", "--tls", SECURE),
    Flag("temporal_tls_ca_file", "--tls-ca", SECURE),
    Flag("temporal_tls_cert_file", "--tls-cert", SECURE),
    Flag("temporal_tls_key_file", "--tls-key", SECURE),
    Flag("temporal_tls_server_name", "--tls-server-name", SECURE),
    Flag("temporal_api_key", "--api-key", SECURE),
    Flag("codec_keys", panel=SECURE),
    Flag("payload_codec", panel=SECURE),
    Flag("operator_key", panel=SECURE),
)
"""Flags before the command: ``agentlease --task-queue Q worker``."""

WORKER = (
    *map(Flag, ("sticky_schedule_to_start", "activity_pollers", "workflow_pollers")),
    Flag("worker_identity", "--identity"),
    *map(Flag, ("decision_mode", "operator_keys", "decision_max_age", "approval_ttl", "redactor", "secret_provider")),
    *map(Flag, ("shutdown_grace", "max_concurrent_activities", "metrics_address", "temporal_metrics", "tracing")),
    *map(Flag, ("workflow_modules", "plugins", "data_converter", "ledger_pool_size", "migrate_on_start")),
    *map(Flag, ("http_base_url", "sql_target_url", "http_allowed_hosts", "sql_allowed_tables", "fencing_key")),
    *map(Flag, ("publish_base_url", "smtp_host", "smtp_port")),
)
SWEEP = (Flag("metrics_address"), Flag("approval_warning"))
UI = (
    Flag("ui_host", "--host"),
    Flag("ui_port", "--port"),
    Flag("temporal_ui"),
    Flag("ui_token", "--token"),
    Flag("ui_allowed_hosts", "--allowed-hosts"),
)
CODEC_SERVER = (
    Flag("codec_server_host", "--host"),
    Flag("codec_server_port", "--port"),
    Flag("codec_server_token", "--token"),
    Flag("codec_server_origins", "--origins"),
)
DECISION = (Flag("operator", "--by"),)

COMMANDS: dict[str, tuple[Flag, ...]] = {
    "agentlease": GLOBAL,
    "worker": WORKER,
    "sweep": SWEEP,
    "ui": UI,
    "codec-server": CODEC_SERVER,
    "approve, reject, redrive, reconcile, cancel": DECISION,
}
"""Which command carries each setting's flag (the docs' table and the completeness test read it)."""

F = TypeVar("F", bound=Callable[..., Any])


def setting_flags(*flags: Flag) -> Callable[[F], F]:
    """Give a command (with a ``ctx: typer.Context`` parameter) a flag for each of ``flags``, applied to its
    settings (``ctx.obj``) before it runs. ConfigurationError at run time: a flag's value does not validate."""

    def decorate(func: F) -> F:
        hints = typing.get_type_hints(func, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(func).parameters.values()
        ]
        added = [
            inspect.Parameter(flag.setting, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=flag.option())
            for flag in flags
        ]
        names = [flag.setting for flag in flags]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            ctx: typer.Context = kwargs["ctx"]
            ctx.obj = _settings_with(ctx.obj, given)
            return func(**kwargs)

        parameters = [*own, *added]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command  # type: ignore[return-value]

    return decorate


def _settings_with(settings: AgentLeaseSettings | None, given: dict[str, Any]) -> AgentLeaseSettings:
    if settings is not None:
        return with_overrides(settings, given)
    try:
        return AgentLeaseSettings(**{name: value for name, value in given.items() if value is not None})
    except ValidationError as exc:
        raise settings_error(exc) from None


def settings_table() -> str:
    """The Markdown table of every setting: variable, flag, default, meaning."""
    flags: dict[str, tuple[str, Flag]] = {}
    for command, group in COMMANDS.items():
        for flag in group:
            flags.setdefault(flag.setting, (command, flag))
    rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    for name, field in AgentLeaseSettings.model_fields.items():
        command, flag = flags[name]
        where = f"`{flag.spelling.split('/')[0]}` ({command})"
        rows.append(f"| `{env_var(name)}` | {where} | `{default_text(name)}` | {field.description} |")
    return "\n".join(rows)


_START, _END = "<!-- settings table: start -->", "<!-- settings table: end -->"


def with_settings_table(page: str) -> str:
    """``page`` with the text between its settings table markers replaced by :func:`settings_table`."""
    head, _, rest = page.partition(_START)
    _, _, tail = rest.partition(_END)
    return f"{head}{_START}\n{settings_table()}\n{_END}{tail}"


if __name__ == "__main__":
    page = Path(sys.argv[1])
    page.write_text(with_settings_table(page.read_text()))
