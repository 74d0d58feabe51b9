"""Lazy re-exports for the package's public faces: a name loads its module on first use, so importing a
face stays cheap (and safe inside Temporal's workflow sandbox)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that load each of ``names`` (name -> module) on use; a name
    whose module is ``<package>.<name>`` is that module.

    Raises (from ``__getattr__``):
        AttributeError: ``name`` is not one of ``names``.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(module)
        value = loaded if module == f"{package}.{name}" else getattr(loaded, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace.get("__all__", names))

    return __getattr__, __dir__
