"""The bars on the code's shape (CONTRIBUTING.md, "Where a change goes"): no module over 800 lines and no
docs page over 2,500 words; ``python -m bench.shape`` prints the figures."""

from __future__ import annotations

from bench.shape import module_lines, page_words


def test_no_module_is_over_800_lines() -> None:
    assert {path: n for path, n in module_lines().items() if n > 800} == {}


def test_no_docs_page_is_over_2500_words() -> None:
    assert {page: n for page, n in page_words().items() if n > 2500} == {}
