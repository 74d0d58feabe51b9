"""The redactor's shortcuts answer as the full checks do: the trigger search as the substring tests on the
lower-cased text, and ``secret_key`` with its kept answers (bounded in number and key length) as without them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentlease.security import redaction
from agentlease.security.redaction import _TRIGGER, _TRIGGERS, secret_key

_PIECES = st.sampled_from([*_TRIGGERS, *(t.upper() for t in _TRIGGERS), "x", " ", "K", "İ", "ſ", "é", "_", "-"])


@given(st.lists(_PIECES | st.text(max_size=4), max_size=12).map("".join))
def test_the_trigger_search_finds_what_the_substring_tests_found(text: str) -> None:
    lowered = text.lower()
    assert (_TRIGGER.search(lowered) is not None) == any(trigger in lowered for trigger in _TRIGGERS)


def test_secret_key_keeps_a_bounded_number_of_short_keys() -> None:
    cached = redaction._secret_key_cached
    cached.cache_clear()
    for n in range(3000):
        assert secret_key(f"field_{n}") is False
        assert secret_key(f"X-Api-Key-{n}") is True
    assert cached.cache_info().currsize <= 1024
    assert secret_key("X-Api-Key") and secret_key("DB.Password") and not secret_key("keyboard")

    long_key = "a" * 200 + "_password"
    cached.cache_clear()
    assert secret_key(long_key)
    assert not secret_key("b" * 300)
    assert cached.cache_info().currsize == 0
