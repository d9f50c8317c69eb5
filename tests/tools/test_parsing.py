"""Hermes-style tool-call parsing from assistant text."""

from __future__ import annotations

from areal_agents.tools import parse_tool_calls, strip_tool_calls


def test_parses_several_calls_with_deterministic_ids() -> None:
    text = (
        "First <tool_call>\n"
        '{"name": "python", "arguments": {"code": "print(1)"}}\n'
        "</tool_call> then <tool_call>"
        '{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>'
    )
    calls, problems = parse_tool_calls(text, id_prefix="call_3")
    assert problems == []
    assert [(c.id, c.name) for c in calls] == [("call_3_0", "python"), ("call_3_1", "search")]
    assert calls[0].parsed_arguments() == {"code": "print(1)"}
    assert calls[1].parsed_arguments() == {"query": "x"}  # arguments given as a JSON string


def test_fenced_json_parameters_key_and_unterminated_block() -> None:
    calls, problems = parse_tool_calls(
        '<tool_call>```json\n{"name": "f", "parameters": {"a": 1}}\n```</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}'
    )
    assert problems == []
    assert [c.name for c in calls] == ["f", "g"]
    assert calls[0].parsed_arguments() == {"a": 1}


def test_problems_are_reported_not_raised() -> None:
    calls, problems = parse_tool_calls(
        '<tool_call>nope</tool_call><tool_call>42</tool_call><tool_call>{"name": 3}</tool_call>'
    )
    assert calls == []
    reasons = [p.reason for p in problems]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "a tool call must be a JSON object"
    assert reasons[2] == 'missing "name" (a string)'


def test_no_calls_and_strip() -> None:
    assert parse_tool_calls("The answer is 4.") == ([], [])
    text = 'Sure. <tool_call>{"name": "f"}</tool_call> Done.'
    assert strip_tool_calls(text) == "Sure.  Done."
