"""builder/core/inputs.py: the fast checks of load_json (integers by a digit-run scan, nesting by
counting brackets) and one_line's plain-ASCII path refuse and keep exactly what the careful ones do."""

from __future__ import annotations

import json

import pytest

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.core.inputs import MAX_INT_DIGITS, load_json, one_line


def _nested(levels: int, inner: str = "1") -> str:
    """``levels`` levels of alternating arrays and objects around ``inner``."""
    text = inner
    for i in range(levels):
        text = f'{{"k{i}": {text}}}' if i % 2 else f"[{text}, \"x\"]"
    return text


def _careful(text: str, max_depth: int) -> object:
    """load_json's careful path alone (the walk over every value)."""
    doc, deep = inputs._walk(json.loads(text), max_depth)
    assert doc is not inputs._FAST_FAILED
    problem = inputs._json_problem(doc, max_depth) if deep else None
    return problem or doc


@pytest.mark.parametrize("levels", [1, 2, 7, 8, 9])
def test_nesting_at_the_bound_passes_and_one_more_is_refused(levels):
    text = _nested(levels)
    for data in (text.encode(), text):  # bytes take the bracket count, str the walk: the same answer
        if levels <= 8:
            assert load_json(data, "r.json", max_depth=8) == json.loads(text)
        else:
            with pytest.raises(EnvbuildError, match=r"^r\.json: not valid JSON: nesting deeper than 8 levels at "):
                load_json(data, "r.json", max_depth=8)


@pytest.mark.parametrize("text", [
    '{"a": "[[[[[[[[[[[[[[[[[[[["}', '["]]]]]]]]}}}}}}}}", {"b": "{{{{{{{{{{{"}]', r'{"a": "x\\", "b": [[1]]}',
    r'["\\\"[[[[[[[[", [[]]]', r'["\"", "[", "]", "\\", [{}]]', '["", "[", "", "]", [[[]]]]',
])
def test_brackets_in_strings_do_not_count(text):
    for depth in (1, 2, 3, 4, 5):
        fast = inputs._nesting_over(text.encode(), depth)
        assert fast == (inputs._json_problem(json.loads(text), depth) is not None), (text, depth)


def test_nesting_count_matches_the_walk_on_many_shapes():
    shapes = [_nested(n, inner) for n in range(0, 12) for inner in ("1", '"[{"', "[]", "{}", '{"a": [[], {}]}')]
    for text in shapes:
        for depth in (1, 3, 6, 10):
            assert inputs._nesting_over(text.encode(), depth) == (
                inputs._json_problem(json.loads(text), depth) is not None), (text, depth)


def test_integer_at_the_bound_passes_and_one_digit_more_is_refused():
    ok = "9" * MAX_INT_DIGITS
    assert load_json(f'{{"n": -{ok}}}'.encode(), "r.json") == {"n": -int(ok)}
    with pytest.raises(EnvbuildError, match=rf"^r\.json: not valid JSON: an integer of {MAX_INT_DIGITS + 1} digits"):
        load_json(f'{{"n": {ok}9}}'.encode(), "r.json")


def test_long_digit_run_in_a_string_is_kept():
    long_digits = "1" * (MAX_INT_DIGITS + 5)
    assert load_json(f'{{"serial": "{long_digits}", "n": 3}}'.encode(), "r.json") == {"serial": long_digits, "n": 3}


def test_fast_and_careful_agree_on_a_node_report():
    from fixtures_nodes import GPU_REPORT

    text = json.dumps(GPU_REPORT)
    assert load_json(text.encode(), "r.json") == _careful(text, inputs.MAX_DEPTH) == GPU_REPORT


@pytest.mark.parametrize("text", ["plain words", "  leading and trailing  ", "a  b", "tab\there", "line\nbreak",
                                  "bidi \u202e override", "caf\u00e9", "", " ", "x" * 500, "del\x7f", "\x1b[31mred"])
@pytest.mark.parametrize("limit", [None, 10, 300])
def test_one_line_fast_path_matches_the_character_loop(text, limit):
    fast = one_line(text, limit)
    slow = one_line("\u2028" + text, limit)  # a separator first: the character loop (it collapses to nothing)
    assert fast == slow
