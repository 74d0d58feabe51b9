"""Which requests a ``FencedClient`` (its ``FencingTransport``) fences: base URLs matched by scheme, host, port and
path segment; a base URL that is not one is refused in one line."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentlease import FencedClient
from agentlease.tools import FencingTransport
from agentlease.tools._fenced_http import is_fenced


def test_fenced_base_urls_are_written_out_and_matched_by_path_segment() -> None:
    transport = FencingTransport(fenced=["https://Refunds.example/v1/", "http://127.0.0.1:8000"])
    assert transport.fenced == ("https://refunds.example:443/v1", "http://127.0.0.1:8000")
    under = ["https://refunds.example/v1", "https://refunds.example:443/v1/refunds?x=1", "http://127.0.0.1:8000/a"]
    elsewhere = [
        "https://refunds.example/v10/refunds",  # another path, not below /v1
        "http://refunds.example/v1/refunds",  # another scheme
        "https://refunds.example:8443/v1",  # another port
        "http://localhost:8000/refunds",  # another host name
    ]
    assert [is_fenced(httpx.URL(url), transport.fenced) for url in under] == [True] * 3
    assert [is_fenced(httpx.URL(url), transport.fenced) for url in elsewhere] == [False] * 4


async def test_a_fenced_client_fences_its_base_url_unless_told_otherwise() -> None:
    async with FencedClient(base_url="http://127.0.0.1:8000/api/") as http:
        assert isinstance(http._transport, FencingTransport)
        assert http._transport.fenced == ("http://127.0.0.1:8000/api",)
    async with FencedClient(fenced=["https://a.example", "https://b.example/v2"]) as http:
        assert isinstance(http._transport, FencingTransport)
        assert http._transport.fenced == ("https://a.example:443", "https://b.example:443/v2")


@pytest.mark.parametrize(
    "given",
    [["refunds.example"], ["ftp://refunds.example"], ["https://refunds.example/?x=1"], "https://refunds.example", [3]],
)
def test_a_fenced_url_that_is_not_a_base_url_is_refused_in_one_line(given: Any) -> None:
    with pytest.raises(ValueError, match="base URL") as refused:
        FencingTransport(fenced=given)
    assert "\n" not in str(refused.value)


def test_a_fenced_client_without_a_base_url_says_what_to_give() -> None:
    with pytest.raises(ValueError, match=r"^a FencedClient fences its base_url: give base_url= or fenced=\[\.\.\.\]$"):
        FencedClient(timeout=5)


def test_a_fenced_client_refuses_what_would_send_requests_around_its_transport() -> None:
    with pytest.raises(ValueError, match=r"^a FencedClient takes no mounts= \(their requests would go out unstamped\)"):
        FencedClient(base_url="https://a.example", mounts={"all://": None})
    with pytest.raises(ValueError, match=r"^give verify, proxy to the transport you pass, not to the FencedClient$"):
        FencedClient(
            base_url="https://a.example", transport=httpx.AsyncHTTPTransport(), verify=False, proxy="http://p:3128"
        )


async def _refund(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id}


def test_a_tool_declares_the_downstreams_it_fences_and_a_bad_one_is_refused_in_one_line() -> None:
    from datetime import timedelta

    from agentlease import leased
    from agentlease.errors import ConfigurationError

    ttl = timedelta(seconds=5)
    one = leased(_refund, side_effect="fenced", lease_ttl=ttl, fenced="http://127.0.0.1:8000/")
    two = leased(_refund, side_effect="fenced", lease_ttl=ttl, fenced=["https://a.example/v1", "https://a.example/v1"])
    assert (one.fenced, two.fenced) == (("http://127.0.0.1:8000",), ("https://a.example:443/v1",))
    assert leased(_refund, side_effect="fenced", lease_ttl=ttl).fenced == ()
    for bad in ("refunds.internal", "ftp://a.example", "https://a.example/?x=1", [1]):
        with pytest.raises(ConfigurationError) as refused:
            leased(_refund, side_effect="fenced", lease_ttl=ttl, fenced=bad)  # type: ignore[arg-type]
        assert str(refused.value).startswith("tool '_refund': fenced downstream") and "\n" not in str(refused.value)
