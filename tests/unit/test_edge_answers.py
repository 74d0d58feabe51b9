"""What a downstream's answers mean to a leased call (``docs/edge.md``): the three 409s told apart."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from agentlease.enums import ErrorClass
from agentlease.errors import (
    EffectInDoubtError,
    KeyInFlightError,
    PermanentToolError,
    RetryableToolError,
    downstream_refusal,
    raise_for_status,
)
from agentlease.recovery._policy import classify

REQUEST = httpx.Request("POST", "http://svc/charges")


def answer(error: str | None, status: int = 409, retry_after: str | None = None) -> httpx.Response:
    body = {} if error is None else {"error": error, "detail": "..."}
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return httpx.Response(status, json=body, headers=headers, request=REQUEST)


def test_in_flight_is_a_wait_with_the_asked_delay() -> None:
    with pytest.raises(KeyInFlightError) as raised:
        raise_for_status(answer("idempotency_key_in_flight", retry_after="2"))
    assert raised.value.retry_after == timedelta(seconds=2)
    assert "POST http://svc/charges" in str(raised.value)
    busy = downstream_refusal(answer("idempotency_key_in_flight", retry_after="soon"))
    assert isinstance(busy, KeyInFlightError) and busy.retry_after == timedelta(seconds=1)


def test_in_doubt_parks_the_task_whatever_its_class() -> None:
    with pytest.raises(EffectInDoubtError) as raised:
        raise_for_status(answer("idempotency_key_in_doubt"), "POST /charges")
    assert classify(raised.value) is ErrorClass.IN_DOUBT


def test_the_httpx_idiom_leads_to_the_same_answers() -> None:
    with pytest.raises(httpx.HTTPStatusError) as raised:
        answer("idempotency_key_in_doubt").raise_for_status()
    assert isinstance(downstream_refusal(raised.value), EffectInDoubtError)
    with pytest.raises(httpx.HTTPStatusError) as stale:
        answer("stale_fencing_token").raise_for_status()
    assert downstream_refusal(stale.value) is None  # a stale token ends the attempt; the newer one decides


@pytest.mark.parametrize(
    ("response", "raised"),
    [
        (answer("stale_fencing_token"), RetryableToolError),
        (answer(None), RetryableToolError),
        (httpx.Response(409, content=b"not json", request=REQUEST), RetryableToolError),
        (answer("idempotency_key_reused", status=422), PermanentToolError),
        (409, RetryableToolError),  # a bare status code cannot say which 409
    ],
)
def test_other_answers_keep_their_meaning(response: httpx.Response | int, raised: type[Exception]) -> None:
    with pytest.raises(raised) as found:
        raise_for_status(response, "POST /charges")
    assert type(found.value) is raised
    raise_for_status(httpx.Response(201, request=REQUEST))  # nothing for a success
