"""Pure tests of the downstream HTTP convention: header parsing, request hashing, fencing tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlease.errors import AgentLeaseError, StaleFencingTokenError
from agentlease.fencing import MAX_GENERATION, FencingToken, check_generation, fences, upsert_for
from agentlease.idempotency.convention import (
    MAX_KEY_LENGTH,
    HeaderError,
    parse_fencing_resource,
    parse_fencing_token,
    parse_idempotency_key,
    request_hash,
)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        (["run-7:publish"], "run-7:publish"),
        (["  padded  "], "padded"),
        (['"run-7:publish"'], "run-7:publish"),  # IETF draft: a structured-field string
        ([r'"say \"hi\" \\ bye"'], r'say "hi" \ bye'),
        (["k" * MAX_KEY_LENGTH], "k" * MAX_KEY_LENGTH),
        (["with spaces inside"], "with spaces inside"),
    ],
)
def test_idempotency_keys_are_parsed_bare_or_quoted(values: list[str], key: str) -> None:
    assert parse_idempotency_key(values) == key


@pytest.mark.parametrize(
    ("values", "code"),
    [
        ([], "missing_idempotency_key"),
        ([""], "invalid_idempotency_key"),
        (['""'], "invalid_idempotency_key"),
        (['"unterminated'], "invalid_idempotency_key"),
        (['"a"b"'], "invalid_idempotency_key"),
        (["k" * (MAX_KEY_LENGTH + 1)], "invalid_idempotency_key"),
        (["caf\u00e9"], "invalid_idempotency_key"),
        (["tab\there"], "invalid_idempotency_key"),
        (["a", "b"], "repeated_idempotency_key"),
    ],
)
def test_bad_idempotency_keys_are_refused_with_a_code(values: list[str], code: str) -> None:
    with pytest.raises(HeaderError) as refused:
        parse_idempotency_key(values)
    assert (refused.value.code, refused.value.header) == (code, "Idempotency-Key")
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    ("values", "token"), [([], None), (["0"], 0), ([" 42 "], 42), ([str(MAX_GENERATION)], MAX_GENERATION)]
)
def test_fencing_tokens_are_decimal_generations(values: list[str], token: int | None) -> None:
    assert parse_fencing_token(values) == token


@pytest.mark.parametrize(
    "raw", ["", "-1", "+1", "1.0", "1e3", "0x10", "seven", "\u0663", "1 2", str(MAX_GENERATION + 1), "9" * 20]
)
def test_bad_fencing_tokens_are_refused(raw: str) -> None:
    with pytest.raises(HeaderError) as refused:
        parse_fencing_token([raw])
    assert (refused.value.code, refused.value.header) == ("invalid_fencing_token", "Fencing-Token")


def test_fencing_resources_are_bounded_and_single() -> None:
    assert parse_fencing_resource([]) is None
    assert parse_fencing_resource(["/articles/7"]) == "/articles/7"
    cases = [
        ([""], "invalid_fencing_resource"),
        (["x" * 401], "invalid_fencing_resource"),
        (["a", "b"], "repeated_fencing_resource"),
    ]
    for values, code in cases:
        with pytest.raises(HeaderError) as refused:
            parse_fencing_resource(values)
        assert refused.value.code == code


def test_request_hash_covers_method_path_query_and_body() -> None:
    base = request_hash("POST", "/articles/1", b"", b'{"title":"a"}')
    assert base == request_hash("post", "/articles/1", b"", b'{"title":"a"}')
    assert len(base) == 64 and int(base, 16) >= 0
    others = {
        request_hash("PUT", "/articles/1", b"", b'{"title":"a"}'),
        request_hash("POST", "/articles/2", b"", b'{"title":"a"}'),
        request_hash("POST", "/articles/1", b"v=1", b'{"title":"a"}'),
        request_hash("POST", "/articles/1", b"", b'{"title":"b"}'),
        request_hash("POST", "/articles/1", b"", b'{"title": "a"}'),  # bytes, not JSON meaning
    }
    assert base not in others and len(others) == 5


@given(
    st.tuples(st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=8)),
    st.tuples(st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=8)),
)
def test_request_hash_parts_never_run_into_each_other(
    a: tuple[bytes, bytes, bytes], b: tuple[bytes, bytes, bytes]
) -> None:
    # Moving bytes between path, query and body is another request (length prefixes).
    def digest(parts: tuple[bytes, bytes, bytes]) -> str:
        return request_hash("POST", parts[0].decode("latin-1"), parts[1], parts[2])

    assert (digest(a) == digest(b)) == (tuple(p.decode("latin-1") for p in a) == tuple(p.decode("latin-1") for p in b))


@pytest.mark.parametrize("bad", [-1, MAX_GENERATION + 1, True, 1.0, "3", None])
def test_generations_are_bigint_integers(bad: object) -> None:
    with pytest.raises(ValueError, match="fencing generation"):
        check_generation(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FencingToken("articles/1", bad)  # type: ignore[arg-type]


def test_fencing_tokens_need_a_resource_key() -> None:
    assert FencingToken("a", 0) == FencingToken("a", 0)
    for key in ("", "x" * 401, None):
        with pytest.raises(ValueError, match="resource key"):
            FencingToken(key, 1)  # type: ignore[arg-type]


def test_upsert_needs_sqlite_or_postgresql() -> None:
    assert upsert_for("sqlite", fences) is not None and upsert_for("postgresql", fences) is not None
    with pytest.raises(ValueError, match="unsupported dialect 'mysql'"):
        upsert_for("mysql", fences)


def test_stale_fencing_token_error_carries_its_facts() -> None:
    error = StaleFencingTokenError("articles/1", 3, 5)
    assert isinstance(error, AgentLeaseError)
    assert (error.resource_key, error.generation, error.current_generation) == ("articles/1", 3, 5)
    assert "generation 3 refused" in str(error) and "accepted generation 5" in str(error)
