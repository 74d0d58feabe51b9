"""The security commands: ``agentlease keys ...`` and ``agentlease codec-server``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agentlease.cli.options import CODEC_SERVER, setting_flags
from agentlease.cli.session import err, require_extra
from agentlease.errors import ConfigurationError
from agentlease.settings import AgentLeaseSettings

keys_app = typer.Typer(help="Operator keys (signed decisions) and payload encryption keys.", no_args_is_help=True)

_out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)


@keys_app.command("new-operator")
def new_operator(
    name: Annotated[str, typer.Argument(help="The operator's name, as the evidence trail will show it.")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write NAME.key and NAME.pub.")] = Path("."),
) -> None:
    """Create an operator's Ed25519 key pair: NAME.key signs decisions, NAME.pub goes to the workers."""
    from agentlease.security.decision_auth import load_public_keys, new_operator_keys, public_key_text

    private, public = new_operator_keys(name, directory)
    key = load_public_keys(f"{name}={public}")[name]
    _out.print(f"wrote {private} (private: keep it to {name}) and {public}")
    _out.print(f"  the CLI of {name}:  export AGENTLEASE_OPERATOR_KEY={private}")
    _out.print(f"  every worker:       AGENTLEASE_OPERATOR_KEYS={name}={public_key_text(key)},...")


@keys_app.command("new-codec-key")
def new_codec_key(
    key_id: Annotated[str, typer.Argument(help="The key's id, kept in each payload it encrypts.")],
) -> None:
    """Print a new payload encryption key as ID:BASE64KEY; put it first in AGENTLEASE_CODEC_KEYS to rotate."""
    from agentlease.security.codec import new_key_entry

    _out.print(new_key_entry(key_id))


@setting_flags(*CODEC_SERVER)
def codec_server(ctx: typer.Context) -> None:
    """Serve the payload codec for the Temporal UI and `temporal` CLI (POST /decode, /encode)."""
    require_extra("ui", "codec-server")
    from agentlease.cli.serving import bound, serve_until_stopped
    from agentlease.runtime.temporal import payload_codec
    from agentlease.security.codec_server import codec_app

    settings: AgentLeaseSettings = ctx.obj
    host, port = settings.codec_server_host, settings.codec_server_port
    codec = payload_codec(settings)
    if codec is None:
        raise ConfigurationError("no payload codec: set AGENTLEASE_CODEC_KEYS (or AGENTLEASE_PAYLOAD_CODEC)")
    app = codec_app(codec, token=settings.codec_server_token, origins=settings.codec_server_origins)

    def announce() -> None:
        guarded = "a bearer token" if settings.codec_server_token else "no token (anyone who reaches it decodes)"
        err.print(
            f"codec server on http://{host}:{port} (POST /decode, /encode), {guarded}; "
            f"CORS origins: {', '.join(settings.codec_server_origins) or 'none'}; Ctrl-C stops"
        )

    with bound(host, port) as sock:
        asyncio.run(serve_until_stopped(app, sock, announce))


DEVELOPMENT_PASSWORDS = frozenset({"agentlease", "worker", "operator", "reader", "postgres", "password", "secret"})
"""Passwords a ledger URL must not carry outside a laptop: docker-compose.yml's defaults and the usual ones."""


def startup_warnings(settings: AgentLeaseSettings) -> list[str]:
    """One line for each default of ``settings`` a deployment beyond a laptop must change: the open decision mode,
    a ledger URL with a development password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    lines = []
    if settings.decision_mode == "open":
        lines.append(
            "warning: open decision mode: whoever can send this task queue's runs an update approves, rejects or "
            "redrives under any name; set AGENTLEASE_DECISION_MODE=authenticated and AGENTLEASE_OPERATOR_KEYS"
        )
    try:
        password = make_url(settings.ledger_url).password
    except ArgumentError:
        password = None
    if password is not None and str(password).lower() in DEVELOPMENT_PASSWORDS:
        lines.append(
            "warning: the ledger URL carries a development default password; set LEDGER_*_PASSWORD "
            "(docker-compose.yml) or your own before the ledger is reachable from another machine"
        )
    return lines


__all__ = ["codec_server", "keys_app", "startup_warnings"]
