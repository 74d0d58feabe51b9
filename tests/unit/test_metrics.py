"""Pure parts of the lease metrics: the address of the endpoint and stage labels."""

from __future__ import annotations

import pytest

from agentlease.enums import Stage
from agentlease.errors import ConfigurationError
from agentlease.observability.metrics import parse_address, stage_label


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (":9464", ("0.0.0.0", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("metrics.internal:0", ("metrics.internal", 0)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9464", "host:", "host:port", "host:70000", "", "host:-1", "host:\u00b2"])
def test_parse_address_refuses_what_is_not_host_port(address: str) -> None:
    with pytest.raises(ConfigurationError, match="expected HOST:PORT"):
        parse_address(address)


def test_stage_label() -> None:
    assert [stage_label(s) for s in (None, Stage.COMMIT, "verify")] == ["none", "commit", "verify"]
