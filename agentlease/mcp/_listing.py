"""A server's recorded ``tools/list``: reading it (``listed=``, or the file recorded beside the declaring module),
recording it (:func:`record_server_tools`), and the argument model made from a listed schema (``docs/mcp.md``).
"""

from __future__ import annotations

import copy
import json
import keyword
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, create_model, model_serializer

from agentlease import limits
from agentlease.errors import ConfigurationError, one_line
from agentlease.mcp._client import MCPServer, list_server_tools

RECORDED_SUFFIX = ".tools.json"
"""A server's recorded listing is ``<server name>.tools.json`` beside the module that declares its tools."""

Listed = Sequence[Mapping[str, Any]] | str | Path
"""A ``tools/list`` answer: a list of tool objects, or the path of a JSON file holding it or ``{"tools": [...]}``."""


class ListedArgs(BaseModel):
    """Arguments of an MCP tool declared by schema: each listed property a field of any type (the server checks
    the types), others allowed; shown to the model as the schema itself. Sent as given: a property the call
    leaves out is not sent (the server applies its own default), in any dump of the arguments."""

    model_config = ConfigDict(extra="allow", frozen=True)
    mcp_input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(cls.mcp_input_schema)

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Every dump leaves out an optional property the call did not give (it is not sent as ``null``)."""
        fields = type(self).model_fields
        given = self.model_fields_set
        dumped: dict[str, Any] = handler(self)
        return {
            name: value
            for name, value in dumped.items()
            if name in given or name not in fields or fields[name].default_factory is not _left_out
        }


def _left_out() -> None:
    """The value of an optional property without a default that a call leaves out (never sent)."""
    return None


def _as_field(name: str) -> bool:
    """Whether property ``name`` can be a model field (else it stays an extra argument, passed on as given)."""
    return (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith(("_", "model_"))
        and not hasattr(BaseModel, name)
    )


def args_model(tool_name: str, schema: Mapping[str, Any]) -> type[BaseModel]:
    """The argument model of MCP tool ``tool_name`` from its JSON ``schema``: required properties required,
    a property with a ``default`` defaulting to it (what an action key fills in), others optional."""
    fixed = dict(copy.deepcopy(schema))
    fixed.setdefault("type", "object")
    fixed.setdefault("properties", {})
    properties = fixed["properties"] if isinstance(fixed["properties"], Mapping) else {}
    required = set(fixed.get("required") or ())
    fields: dict[str, Any] = {}
    for name, prop in properties.items():
        if not _as_field(name):
            continue
        if name in required:
            fields[name] = (Any, ...)
        elif isinstance(prop, Mapping) and "default" in prop:
            fields[name] = (Any, prop["default"])
        else:
            fields[name] = (Any, Field(default_factory=_left_out))
    model_name = "".join(part[:1].upper() + part[1:] for part in tool_name.replace("-", "_").split("_")) + "Args"
    model: type[BaseModel] = create_model(model_name, __base__=ListedArgs, __module__=__name__, **fields)
    model.mcp_input_schema = fixed
    return model


def optional_key_fields(model: type[BaseModel], names: Sequence[str]) -> list[str]:
    """Of ``names``, the listed properties a call may leave out with no default (unfit for an action key)."""
    if not issubclass(model, ListedArgs):
        return []
    return [n for n in names if n in model.model_fields and model.model_fields[n].default_factory is _left_out]


def read_listed(listed: Listed | None) -> dict[str, dict[str, Any]]:
    """The tools of a ``tools/list`` answer by name (``ConfigurationError``: unreadable, over
    :data:`~agentlease.limits.MAX_LISTING_BYTES`, not a file, or a tool without a name)."""
    if listed is None:
        return {}
    if isinstance(listed, str | Path):
        try:
            loaded = json.loads(limits.read_file(Path(listed), limits.MAX_LISTING_BYTES))
        except OSError as exc:
            raise ConfigurationError(f"cannot read the listed MCP tools from {listed}: {exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than Python's stack
            raise ConfigurationError(f"cannot read the listed MCP tools from {listed}: {one_line(exc)}") from None
        found = loaded.get("tools") if isinstance(loaded, dict) else loaded
        if not isinstance(found, list):
            raise ConfigurationError(f'{listed}: listed MCP tools are a JSON list, or {{"tools": [...]}}')
        listed = found
    assert not isinstance(listed, str | Path)
    unnamed = [tool for tool in listed if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str)]
    if unnamed:
        raise ConfigurationError(f"listed MCP tools are tools/list objects with a name; not {unnamed[0]!r:.80}")
    return {tool["name"]: dict(tool) for tool in listed}


def recorded_path(server: MCPServer, directory: Path) -> Path:
    """Where the listing of ``server`` is recorded for the tools declared in ``directory``."""
    return directory / f"{server.name}{RECORDED_SUFFIX}"


async def record_server_tools(server: MCPServer, path: str | Path) -> Path:
    """Ask ``server`` for its ``tools/list`` and write it to ``path`` as ``{"server": name, "tools": [...]}``
    (sorted by name, indented: a file to keep with the code and review in its diffs). Record it as
    ``<server name>.tools.json`` beside the module calling :func:`~agentlease.mcp.mcp_tools`, which reads it
    by default.

    Returns:
        The path written.

    Raises:
        OSError, mcp.MCPError, ...: the server could not be reached or the file written.
    """
    tools = sorted(await list_server_tools(server), key=lambda tool: str(tool["name"]))
    target = Path(path)
    target.write_text(json.dumps({"server": server.name, "tools": tools}, indent=2, sort_keys=True) + "\n")
    return target


__all__ = [
    "RECORDED_SUFFIX",
    "ListedArgs",
    "args_model",
    "optional_key_fields",
    "read_listed",
    "record_server_tools",
    "recorded_path",
]
