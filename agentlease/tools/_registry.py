"""The tools one worker serves: a registry by name, loaded from the built-ins and tool modules."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType

from agentlease.errors import ConfigurationError, UnknownToolError
from agentlease.records import ToolInfo
from agentlease.tools import builtin
from agentlease.tools._declaration import ToolSpec


class ToolRegistry:
    """The tools one worker serves, by name."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ToolSpec) -> None:
        """Register a tool. Raises :class:`ConfigurationError` for a second tool of the same name."""
        if spec.name in self._specs and self._specs[spec.name] is not spec:
            raise ConfigurationError(f"two tools are named {spec.name!r}")
        self._specs[spec.name] = spec

    def add_module(self, module: ModuleType) -> None:
        """Register every :class:`ToolSpec` defined at the top level of ``module`` (``ConfigurationError``: none)."""
        found = [value for value in vars(module).values() if isinstance(value, ToolSpec)]
        if not found:
            raise ConfigurationError(
                f"tool module {module.__name__!r} declares no tool (no @tool or leased(...) object at its top level)"
            )
        for spec in found:
            self.add(spec)

    def get(self, name: str) -> ToolSpec:
        """The tool named ``name``. Raises :class:`UnknownToolError`."""
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownToolError(name, list(self._specs)) from None

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[ToolSpec]:
        return [self._specs[name] for name in self.names()]

    def catalog(self) -> list[ToolInfo]:
        """What the workflow learns of every tool (see ``describe_tools``)."""
        return [spec.info() for spec in self.specs()]


def load_registry(module_names: Iterable[str] = (), *, builtins: bool = True) -> ToolRegistry:
    """The built-in tools plus the tools of the named modules (``ConfigurationError``: a module cannot be
    imported or declares no tool, or two tools share a name)."""
    registry = ToolRegistry(builtin.TOOLS if builtins else ())
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import tool module {module_name!r}: {exc}") from None
        registry.add_module(module)
    return registry
