"""What a downstream's answers mean to a leased call (``docs/edge.md``): the three 409s told apart."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from agentlease.enums import ErrorClass
from agentlease.errors import (
    CredentialToolError,
    EffectInDoubtError,
    KeyInFlightError,
    PermanentToolError,
    RetryableToolError,
    answer_error,
    downstream_refusal,
    raise_for_status,
    raised_refusal,
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


@pytest.mark.parametrize(
    ("response", "error_class"),
    [
        (httpx.Response(401, request=REQUEST), ErrorClass.CREDENTIAL),
        (httpx.Response(403, request=REQUEST), ErrorClass.CREDENTIAL),
        (answer("idempotency_key_in_doubt"), ErrorClass.IN_DOUBT),
        (answer("idempotency_key_reused", status=422), ErrorClass.RETRYABLE),
        (httpx.Response(404, request=REQUEST), ErrorClass.RETRYABLE),
        (httpx.Response(503, request=REQUEST), ErrorClass.RETRYABLE),
    ],
)
def test_an_answer_raised_by_httpx_says_what_it_means_beyond_failed(
    response: httpx.Response, error_class: ErrorClass
) -> None:
    """``response.raise_for_status()`` in a leased tool: a 401 or 403 blocks the call (it was retried until the
    attempts ran out, then a write past ``external_call`` parked as an effect that may be in place); any other
    4xx is retried per its stage as any exception, never dead-lettered: answering a retry, it may be the
    downstream's view of an earlier attempt's effect."""
    with pytest.raises(httpx.HTTPStatusError) as raised:
        response.raise_for_status()
    refusal = raised_refusal(raised.value)
    assert classify(refusal or raised.value) is error_class
    if error_class is ErrorClass.CREDENTIAL:
        assert str(refusal) == "POST http://svc/charges: HTTP " + str(response.status_code)


def test_an_exception_without_an_answer_keeps_its_own_class() -> None:
    assert raised_refusal(RuntimeError("boom")) is None
    assert raised_refusal(CredentialToolError("revoked")) is None  # a tool error says what it means itself
    no_request = httpx.Response(401)  # httpx raises reading .request of a response built without one
    assert isinstance(answer_error(no_request), CredentialToolError)
    assert answer_error(httpx.Response(204)) is None

    class Odd(Exception):
        @property
        def response(self) -> object:
            raise RuntimeError("no response here")

    assert raised_refusal(Odd()) is None  # classified as any exception, not a crash of the classification
