"""The web view's JSON under ``/api`` is documented (``docs/web-view.md``): every path the app serves there
is in the page's table, and the table lists no path the app does not serve."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import Route

from agentlease.ledger.store import Ledger
from agentlease.ui.app import ui_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "web-view.md"


async def test_every_path_under_api_is_documented_and_every_documented_one_is_served(tmp_path: Path) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")  # never opened: the routes only
    try:
        routes = [r for r in ui_app(ledger).routes if isinstance(r, Route) and r.path.startswith("/api")]
    finally:
        await ledger.close()
    served = {f"{method} {route.path_format}" for route in routes for method in route.methods or () if method != "HEAD"}
    documented = set(re.findall(r"^\| `(GET /api/[^`]*)` \|", DOC.read_text(), re.MULTILINE))

    assert served, "the app serves nothing under /api"
    assert served - documented == set(), f"served under /api but not in {DOC.name}"
    assert documented - served == set(), f"in {DOC.name} but not served"
