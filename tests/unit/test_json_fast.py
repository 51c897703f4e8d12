"""builder/core/inputs.py: load_json's bounds (nesting, integers) at the limit and one over, and
one_line's plain-ASCII path keeps exactly what the careful one does."""

from __future__ import annotations

import json

import pytest

from builder.core.errors import EnvbuildError
from builder.core.inputs import MAX_INT_DIGITS, load_json, one_line


def _nested(levels: int, inner: str = "1") -> str:
    """``levels`` levels of alternating arrays and objects around ``inner``."""
    text = inner
    for i in range(levels):
        text = f'{{"k{i}": {text}}}' if i % 2 else f"[{text}, \"x\"]"
    return text


@pytest.mark.parametrize("levels", [1, 2, 7, 8, 9])
def test_nesting_at_the_bound_passes_and_one_more_is_refused(levels):
    text = _nested(levels)
    for data in (text.encode(), text):
        if levels <= 8:
            assert load_json(data, "r.json", max_depth=8) == json.loads(text)
        else:
            with pytest.raises(EnvbuildError, match=r"^r\.json: not valid JSON: nesting deeper than 8 levels at "):
                load_json(data, "r.json", max_depth=8)


def test_integer_at_the_bound_passes_and_one_digit_more_is_refused():
    ok = "9" * MAX_INT_DIGITS
    assert load_json(f'{{"n": -{ok}}}'.encode(), "r.json") == {"n": -int(ok)}
    with pytest.raises(EnvbuildError, match=rf"^r\.json: not valid JSON: an integer of {MAX_INT_DIGITS + 1} digits"):
        load_json(f'{{"n": {ok}9}}'.encode(), "r.json")


def test_long_digit_run_in_a_string_is_kept():
    long_digits = "1" * (MAX_INT_DIGITS + 5)
    assert load_json(f'{{"serial": "{long_digits}", "n": 3}}'.encode(), "r.json") == {"serial": long_digits, "n": 3}


def test_a_node_report_reads_as_it_was_written():
    from fixtures_nodes import GPU_REPORT

    assert load_json(json.dumps(GPU_REPORT).encode(), "r.json") == GPU_REPORT


@pytest.mark.parametrize("text", ["plain words", "  leading and trailing  ", "a  b", "tab\there", "line\nbreak",
                                  "bidi \u202e override", "caf\u00e9", "", " ", "x" * 500, "del\x7f", "\x1b[31mred"])
@pytest.mark.parametrize("limit", [None, 10, 300])
def test_one_line_fast_path_matches_the_character_loop(text, limit):
    fast = one_line(text, limit)
    slow = one_line("\u2028" + text, limit)  # a separator first: the character loop (it collapses to nothing)
    assert fast == slow
