"""Property-based tests of tool-call parsing on random, huge, nested and non-UTF-8 text.

Seeded (``derandomize``) and bounded so that CI is stable and quick; the pytest time limit on
each test is the hang guard (parsing is linear, so every example takes milliseconds).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_agents.tools import parse_tool_calls, strip_tool_calls
from areal_agents.tools.parsing import MAX_JSON_DEPTH, load_json

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# any code point, lone surrogates included (text a broken client may hand over)
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_call", "tool_call>", "{", "}", "[", "]", '"', "\\",
    ":", ",", " ", "\n", "\t", "```", "```json", '"name"', '"arguments"', '"parameters"',
    "null", "1e400", "9" * 5000, "\ud800", "\x00", "é", '{"name": "f", "arguments": {}}',
]  # fmt: skip
HOSTILE = st.lists(
    st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from([1, 2, 50, 5000, 100_000])),
    max_size=8,
).map(lambda parts: "".join(fragment * min(n, 200_000 // len(fragment)) for fragment, n in parts))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _check(text: str) -> None:
    calls, problems = parse_tool_calls(text, id_prefix="c")
    assert len(calls) + len(problems) == text.count("<tool_call>") - _nested_opens(text)
    for call in calls:
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.arguments, str)
    assert len({c.id for c in calls}) == len(calls)
    for problem in problems:
        assert isinstance(problem.reason, str) and problem.reason
    assert len(strip_tool_calls(text)) <= len(text)


def _nested_opens(text: str) -> int:
    """Openings inside a block (before its closing tag) do not start a block of their own."""
    count, pos = 0, 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        end = text.find("</tool_call>", start + 11)
        stop = len(text) if end < 0 else end
        count += text.count("<tool_call>", start + 11, stop)
        if end < 0:
            break
        pos = end + 12
    return count


@pytest.mark.timeout(120)
@FUZZ
@given(ANY_TEXT)
def test_random_text_never_raises(text: str) -> None:
    _check(text)


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=100)
@given(HOSTILE)
def test_huge_nested_and_broken_text_never_raises_or_hangs(text: str) -> None:
    _check(text)
    _check(f"<tool_call>{text}</tool_call>")
    _check(f'<tool_call>{{"name": "f", "arguments": {text}}}')


@pytest.mark.timeout(120)
@FUZZ
@given(
    st.lists(
        st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,20}", fullmatch=True), JSON),
        max_size=4,
    ),
    st.lists(ANY_TEXT.map(lambda t: t.replace("<tool_call>", "")), min_size=5, max_size=5),
)
def test_well_formed_calls_round_trip_through_prose(
    calls: list[tuple[str, Any]], prose: list[str]
) -> None:
    text = prose[0]
    for i, (name, arguments) in enumerate(calls):
        text += f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
        text += prose[1 + i % 4]
    parsed, problems = parse_tool_calls(text)
    if "tool_call>" in text.replace("<tool_call>", "").replace("</tool_call>", "") or (
        "<tool_call" in "".join(prose)
    ):
        return  # prose or a string that forms tags; the other properties cover those
    assert problems == []
    assert [c.name for c in parsed] == [name for name, _ in calls]
    for call, (_, arguments) in zip(parsed, calls, strict=True):
        if isinstance(arguments, str):
            assert call.arguments == arguments
        else:
            assert json.loads(call.arguments) == arguments


@pytest.mark.timeout(120)
@FUZZ
@given(JSON, st.integers(0, 2 * MAX_JSON_DEPTH))
def test_load_json_bounds_depth_and_only_raises_value_error(value: Any, depth: int) -> None:
    text = "[" * depth + json.dumps(value) + "]" * depth
    total = depth + _depth(value)
    if total > MAX_JSON_DEPTH:
        with pytest.raises(ValueError, match="nested deeper"):
            load_json(text)
    else:
        assert load_json(text) == json.loads(text)
    for bad in (text[:-1], text + "x", "[" * (depth * 1000 + 1)):
        with contextlib.suppress(ValueError):  # anything but a ValueError fails the test
            load_json(bad)
