"""Ledger URLs as users write them: drivers chosen, ``~`` expanded, passwords never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlease.errors import ConfigurationError
from agentlease.ledger.engine import async_url, display_url, sqlite_path


def test_sqlite_and_postgresql_get_their_async_drivers() -> None:
    assert async_url("sqlite:////var/lib/ledger.db") == "sqlite+aiosqlite:////var/lib/ledger.db"
    assert async_url("postgresql://u:p@db:5432/ledger") == "postgresql+asyncpg://u:p@db:5432/ledger"


def test_a_home_relative_sqlite_path_is_expanded_for_the_engine_and_the_file_check() -> None:
    home = Path("~").expanduser()
    assert async_url("sqlite:///~/led/ledger.db") == f"sqlite+aiosqlite:///{home}/led/ledger.db"
    assert sqlite_path("sqlite:///~/led/ledger.db") == home / "led" / "ledger.db"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:s3cret@127.0.0.1:notaport/x",  # does not parse: masked all the same
        "postgresql://postgres:s3cret@127.0.0.1:5432/x",
    ],
)
def test_passwords_are_masked_in_messages(url: str) -> None:
    assert "s3cret" not in display_url(url)
    assert "postgres:***@127.0.0.1" in display_url(url)


def test_a_bad_url_is_refused_without_showing_its_password() -> None:
    with pytest.raises(ConfigurationError) as refused:
        async_url("postgresql://postgres:s3cret@127.0.0.1:notaport/x", name="ledger")
    assert "s3cret" not in str(refused.value) and "bad ledger URL" in str(refused.value)
