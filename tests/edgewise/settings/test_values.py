"""The coercion table: every process reads a YAML or text value the same way (pure, no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import pytest

from edgewise.settings.values import Problem, coerce, is_null, optional, sequence, split_text


@pytest.mark.parametrize("tp, value, expected", [
    (bool, True, True), (bool, "yes", True), (bool, "OFF", False), (bool, " on ", True), (bool, "0", False),
    (bool, 1, True), (bool, 0, False),
    (int, 3, 3), (int, 3.0, 3), (int, "3", 3), (int, "3.0", 3), (int, " -7 ", -7), (int, "1e3", 1000),
    (float, 5, 5.0), (float, "0.5", 0.5), (float, "1e-3", 0.001), (float, 2.5, 2.5),
    (str, "x", "x"), (str, 5, "5"), (str, 0.5, "0.5"), (str, "", ""),
    (Literal["Pods", "Percent"], "Pods", "Pods"), (Any, [1], [1]),
])
def test_accepted_values(tp: Any, value: Any, expected: Any) -> None:
    got = coerce(tp, value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("tp, value, what", [
    (bool, "maybe", "a boolean"), (bool, 2, "a boolean"), (bool, None, "a boolean"), (bool, 0.5, "a boolean"),
    (int, True, "an integer"), (int, 3.5, "an integer"), (int, "3.5", "an integer"), (int, "three", "an integer"),
    (int, float("inf"), "an integer"), (int, None, "an integer"), (int, [3], "an integer"),
    (float, False, "a number"), (float, "fast", "a number"), (float, "nan", "a number"), (float, "inf", "a number"),
    (float, None, "a number"),
    (str, True, "a string"), (str, None, "a string"), (str, ["a"], "a string"), (str, {"a": 1}, "a string"),
])
def test_refused_values_say_what_was_expected(tp: Any, value: Any, what: str) -> None:
    with pytest.raises(Problem) as ei:
        coerce(tp, value)
    assert ei.value.what == what


def test_type_shapes() -> None:
    assert optional(Optional[int]) == (int, True) and optional(int) == (int, False)
    assert sequence(List[str]) == (str, None, list)
    assert sequence(Tuple[int, ...]) == (int, None, tuple)
    assert sequence(Tuple[float, float]) == (float, 2, tuple)
    assert sequence(Dict[str, Any]) is None
    with pytest.raises(TypeError):
        optional(Union[int, str])
    with pytest.raises(TypeError):
        sequence(Tuple[int, str])


def test_text_lists_and_nulls() -> None:
    assert split_text("a:1, b:2,,") == ["a:1", "b:2"]
    assert split_text("[4, 8]") == ["4", "8"] and split_text("") == [] and split_text(" [ ] ") == []
    assert is_null(None) and is_null("") and is_null(" NULL ") and not is_null("none") and not is_null(0)
