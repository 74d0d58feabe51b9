"""The bounds on what a tool or a probe returns, and the cut of long reasons (``docs/limits.md``)."""

from __future__ import annotations

import pytest

from agentlease import limits
from agentlease.errors import PermanentToolError


def test_clip_keeps_short_text_and_cuts_long_text_with_the_marker() -> None:
    assert limits.clip("short") == "short"
    cut = limits.clip("r" * (limits.MAX_REASON_CHARS + 1))
    assert len(cut) == limits.MAX_REASON_CHARS and cut.endswith(limits.CLIPPED)


@pytest.mark.parametrize(
    ("output", "receipt", "named"),
    [
        (
            {"x": "o" * limits.MAX_OUTPUT_BYTES},
            {},
            f"more than {limits.MAX_OUTPUT_BYTES} (the bound on a tool's output)",
        ),
        (
            {},
            {"x": "r" * limits.MAX_RECEIPT_BYTES},
            f"more than {limits.MAX_RECEIPT_BYTES} (the bound on a tool's receipt)",
        ),
        ({"x": float("nan")}, {}, "which JSON cannot carry (the bound on a tool's output)"),
    ],
)
def test_a_result_that_cannot_be_recorded_is_a_permanent_failure(output: dict, receipt: dict, named: str) -> None:
    with pytest.raises(PermanentToolError, match=r"^output|^receipt") as info:
        limits.check_tool_result(output, receipt, "report")
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_result_within_the_bounds_passes() -> None:
    limits.check_tool_result({"x": "o" * 1000}, {"status": "present"}, "report")
    limits.check_probe_answer({"seen": 1}, None)


def test_a_probe_answer_over_the_bound_is_refused() -> None:
    with pytest.raises(ValueError, match=r"the bound on a probe's evidence\); the answer is not recorded"):
        limits.check_probe_answer({"dump": "e" * limits.MAX_EVIDENCE_BYTES}, None)
