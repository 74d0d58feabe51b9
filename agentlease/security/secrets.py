"""What a tool may know: ``ctx.settings`` (:class:`ToolSettings`, the settings it may read) and ``ctx.secrets``
(:class:`ToolSecrets`, its own secrets from the worker's :class:`SecretProvider`). ``docs/security-operations.md``
("Tool credentials")."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentlease.errors import ConfigurationError, CredentialToolError, PermanentToolError

if TYPE_CHECKING:
    from agentlease.settings import AgentLeaseSettings

WORKER_ONLY = frozenset(
    (
        *("ledger_url", "ledger_pool_size", "migrate_on_start", "temporal_api_key", "temporal_tls_key_file"),
        *("temporal_tls_cert_file", "codec_keys", "payload_codec", "codec_server_token", "ui_token", "operator_keys"),
        *("operator_key", "decision_mode", "redactor", "secret_provider", "plugins", "data_converter"),
    )
)
"""Settings no tool sees: the worker's own connections and secrets."""


class SettingNotAllowedError(PermanentToolError, AttributeError):
    """A ``tool`` read a ``setting`` it did not declare, or one of :data:`WORKER_ONLY`: a permanent tool error."""

    def __init__(self, tool: str, setting: str, declared: Iterable[str] | None) -> None:
        if declared is None:
            why = "a setting of the worker itself, which no tool sees"
        else:
            why = f"not among the settings it declares ({', '.join(sorted(declared)) or 'none'})"
        super().__init__(f"tool {tool!r} may not read setting {setting!r}: {why}")
        self.tool = tool
        self.setting = setting


class MissingSecretError(CredentialToolError):
    """The provider has no secret ``name`` of ``tool``: a credential error (blocked until provided, redriven)."""

    def __init__(self, tool: str, name: str, where: str) -> None:
        super().__init__(f"tool {tool!r} has no secret {name!r} ({where})")
        self.tool = tool
        self.name = name


class ToolSettings:
    """The settings ``tool`` may read (those it ``declared``; ``None``: all but :data:`WORKER_ONLY`), copied from
    the worker's ``settings``, which are not kept."""

    __slots__ = ("_declared", "_tool", "_values")

    def __init__(self, settings: AgentLeaseSettings, tool: str, declared: Iterable[str] | None = None) -> None:
        self._tool = tool
        self._declared = None if declared is None else frozenset(declared)
        names = type(settings).model_fields
        allowed = (n for n in names if n not in WORKER_ONLY) if self._declared is None else self._declared & set(names)
        self._values: dict[str, Any] = {name: getattr(settings, name) for name in allowed}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            if self._declared is not None and name in self._declared:
                raise AttributeError(f"no setting {name!r}") from None
            raise SettingNotAllowedError(self._tool, name, self._declared) from None

    def __repr__(self) -> str:
        return f"ToolSettings(tool={self._tool!r})"


@runtime_checkable
class SecretProvider(Protocol):
    """Where tools' secrets come from: ``get(tool, name)``, the secret or ``None``; called from the tool's
    attempt, so keep it fast or cache."""

    def get(self, tool: str, name: str) -> str | None: ...


SECRET_NAME = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")
"""A secret's name: letters and digits, single underscores between them (``api_token``)."""


class SecretNameError(PermanentToolError, ValueError):
    """A tool asked for a secret whose name is not letters and digits joined by single underscores."""


class EnvSecretProvider:
    """Secrets from ``environ`` (default ``os.environ``): ``AGENTLEASE_SECRET_<TOOL>__<NAME>``, upper case, any
    other character than a letter or digit as ``_``. A name (:data:`SECRET_NAME`) holds no ``__`` nor edge ``_``,
    so no two (tool, name) pairs share a variable."""

    PREFIX = "AGENTLEASE_SECRET_"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    @classmethod
    def variable(cls, tool: str, name: str) -> str:
        """The variable holding ``tool``'s secret ``name``; SecretNameError if not a :data:`SECRET_NAME`."""
        if not SECRET_NAME.fullmatch(name):
            raise SecretNameError(
                f"tool {tool!r} asked for secret {name!r}: a secret's name is letters and digits joined by "
                "single underscores"
            )
        return f"{cls.PREFIX}{re.sub(r'[^A-Za-z0-9]', '_', tool).upper()}__{name.upper()}"

    def get(self, tool: str, name: str) -> str | None:
        return self._environ.get(self.variable(tool, name))


class ToolSecrets:
    """One tool's secrets: :meth:`get` asks the worker's ``provider`` for ``tool``'s own, never another's."""

    __slots__ = ("_provider", "_tool")

    def __init__(self, provider: SecretProvider, tool: str) -> None:
        self._provider = provider
        self._tool = tool

    def get(self, name: str) -> str:
        """The tool's secret ``name``; MissingSecretError when the provider has none."""
        value = self._provider.get(self._tool, name)
        if value is None:
            where = (
                f"set {EnvSecretProvider.variable(self._tool, name)}"
                if isinstance(self._provider, EnvSecretProvider)
                else "the configured secret provider has none"
            )
            raise MissingSecretError(self._tool, name, where)
        return value

    def __repr__(self) -> str:
        return f"ToolSecrets(tool={self._tool!r})"


def secret_provider(settings: AgentLeaseSettings) -> SecretProvider:
    """The provider of ``settings.secret_provider`` (``module:attribute``), default the environment's;
    ConfigurationError when it cannot be loaded or has no ``get(tool, name)``."""
    if not settings.secret_provider:
        return EnvSecretProvider()
    from agentlease.settings import load_object

    provider = load_object(settings.secret_provider, "secret provider")
    if not isinstance(provider, SecretProvider):
        raise ConfigurationError(f"secret provider {settings.secret_provider!r} has no get(tool, name)")
    return provider


__all__ = [
    "SECRET_NAME",
    "WORKER_ONLY",
    "EnvSecretProvider",
    "MissingSecretError",
    "SecretNameError",
    "SecretProvider",
    "SettingNotAllowedError",
    "ToolSecrets",
    "ToolSettings",
    "secret_provider",
]
