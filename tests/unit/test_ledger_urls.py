"""Ledger URLs as users write them: drivers chosen, ``~`` expanded, passwords never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlease.errors import ConfigurationError
from agentlease.ledger.engine import PG_CONNECT_TIMEOUT_S, async_url, display_url, pg_connect_args, sqlite_path


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
        "postgresql://postgres:s3@cret@127.0.0.1:5432/x",  # an unencoded "@": no part of the password shown
        "postgresql://postgres:s3cret@@127.0.0.1/x",
    ],
)
def test_passwords_are_masked_in_messages(url: str) -> None:
    assert "s3" not in display_url(url) and "cret" not in display_url(url)
    assert "postgres:***@127.0.0.1" in display_url(url)


def test_a_bad_url_is_refused_without_showing_its_password() -> None:
    with pytest.raises(ConfigurationError) as refused:
        async_url("postgresql://postgres:s3cret@127.0.0.1:notaport/x", name="ledger")
    assert "s3cret" not in str(refused.value) and "bad ledger URL" in str(refused.value)


def test_libpq_options_reach_asyncpg_under_its_own_names() -> None:
    url = "postgresql://u:p@db:5432/ledger?sslmode=require&connect_timeout=5&application_name=worker-1"
    assert async_url(url) == "postgresql+asyncpg://u:p@db:5432/ledger"  # the options go as connect arguments
    assert pg_connect_args(url) == {
        "ssl": "require",
        "timeout": 5.0,
        "server_settings": {"application_name": "worker-1"},
    }
    assert pg_connect_args("postgres://u@db/ledger?ssl=verify-full&prepared_statement_cache_size=0") == {
        "ssl": "verify-full",
        "timeout": PG_CONNECT_TIMEOUT_S,
        "prepared_statement_cache_size": 0,
    }
    assert pg_connect_args("postgresql://u@db/ledger") == {"timeout": PG_CONNECT_TIMEOUT_S}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://u:s3cret@db:99999/x", "port 99999 is not between 1 and 65535"),
        ("postgresql://u:s3cret@db:0/x", "port 0 is not between 1 and 65535"),
        ("postgresql://u:s3cret@db/x?sslrootcert=/ca.pem", "unsupported option 'sslrootcert' (supported: sslmode, "),
        ("postgresql://u:s3cret@db/x?options=-csearch_path%3Dx", "unsupported option 'options'"),
        ("postgresql://u:s3cret@db/x?sslmode=on", "sslmode must be one of disable, allow, prefer, require"),
        ("postgresql://u:s3cret@db/x?sslmode=require&ssl=disable", "sslmode and ssl both set"),
        ("postgresql://u:s3cret@db/x?sslmode=require&sslmode=disable", "sslmode given 2 times"),
        ("postgresql://u:s3cret@db/x?sslmode=", "option 'sslmode' without a value"),  # libpq refuses it too
        ("postgresql://u:s3cret@db/x?application_name=x&sslmode", "option 'sslmode' without a value"),
        (
            "postgresql://u:s3cret@db/x?connect_timeout=0",
            "connect_timeout must be a whole number of seconds, at least 1",
        ),
        ("postgresql://u:s3cret@db/x?connect_timeout=-1", "connect_timeout must be a whole number of seconds"),
        ("postgresql://u:s3cret@db/x?application_name=a%1Bb", "application_name must be printable ASCII"),
        (
            "postgresql://u:s3cret@db/x?prepared_statement_cache_size=many",
            "prepared_statement_cache_size must be a whole",
        ),
    ],
)
def test_a_postgresql_url_the_driver_would_fail_on_is_refused_in_one_line(url: str, why: str) -> None:
    """Each was a traceback from the driver at the first connection (``connect() got an unexpected keyword
    argument 'sslmode'``, ``port must be 0-65535``)."""
    for check in (async_url, pg_connect_args, sqlite_path):
        with pytest.raises(ConfigurationError) as refused:
            check(url, name="ledger")
        message = str(refused.value)
        assert message.startswith("bad ledger URL 'postgresql://u:***@db") and why in message, message
        assert "s3cret" not in message and "\n" not in message
