"""Chat templates with tools, and the token-exact incremental rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from areal_agents.policies.templates import (
    assistant_closing_text,
    chat_template_for,
    continuation_ids,
    render_prompt,
    render_prompt_ids,
    supports_tools,
    tool_chat_template,
)
from areal_agents.types import Message, ToolCall, ToolSpec

TOOLS = [
    ToolSpec(
        "calculator",
        "Evaluate arithmetic.",
        {"type": "object", "properties": {"expression": {"type": "string"}}},
    )
]


def _conversation() -> list[Message]:
    call = ToolCall("calculator", '{"expression": "2+3"}', "c0")
    return [
        Message.system("Be careful."),
        Message.user("What is 2+3?"),
        Message.assistant("Let me compute.", [call]),
        Message.tool("5", "c0", "calculator"),
        Message.tool("extra", "c1", "calculator"),
    ]


def test_tool_schemas_and_calls_are_rendered(tokenizer: Any) -> None:
    text = render_prompt(tokenizer, _conversation(), TOOLS)
    assert text.startswith("<|im_start|>system\nBe careful.\n\n# Tools")
    assert json.dumps(TOOLS[0].to_openai()) in text
    # A JSON-string argument is written as it is, not double-encoded.
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}' in text
    # Consecutive tool results share one user turn.
    assert text.count("<tool_response>") == 2
    assert "<tool_response>\n5\n</tool_response>\n<tool_response>\nextra" in text
    assert text.endswith("<|im_start|>assistant\n")
    no_tools = render_prompt(tokenizer, [Message.user("hi")], [])
    assert no_tools == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_without_tools_gets_the_project_template(tokenizer: Any) -> None:
    class Plain:  # SmolLM2's original template: ChatML, no tools section
        chat_template = (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}"
        )
        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            return tokenizer.apply_chat_template(conversation, **kwargs)

    plain = Plain()
    assert not supports_tools(plain)  # type: ignore[arg-type]
    assert chat_template_for(plain) == tool_chat_template()  # type: ignore[arg-type]
    assert supports_tools(tokenizer)


def test_continuation_extends_the_sampled_tokens_exactly(tokenizer: Any) -> None:
    convo = _conversation()
    prior, new = convo[:3], convo[3:]
    prompt = render_prompt_ids(tokenizer, prior[:2], TOOLS)
    # What the model "sampled": the assistant text exactly as the template would render it,
    # ending with the end-of-turn token, as a real generation does.
    full_prior = render_prompt(tokenizer, prior, TOOLS, add_generation_prompt=False)
    head = render_prompt(tokenizer, prior[:2], TOOLS)
    sampled = tokenizer.encode(full_prior[len(head) :].rstrip("\n"), add_special_tokens=False)
    assert sampled[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    tail = continuation_ids(tokenizer, prior, new, TOOLS, sampled_ids=sampled)
    # Rendering everything at once gives the same tokens as the incremental path.
    assert prompt + sampled + tail == render_prompt_ids(tokenizer, convo, TOOLS)
    assert tokenizer.decode(tail).startswith("\n<|im_start|>user\n<tool_response>")


def test_a_turn_cut_by_max_tokens_is_closed_by_the_template(tokenizer: Any) -> None:
    convo = [Message.user("Count."), Message.assistant("1 2 3"), Message.user("More.")]
    sampled = tokenizer.encode("1 2 3", add_special_tokens=False)  # no end-of-turn token
    tail = continuation_ids(tokenizer, convo[:2], convo[2:], [], sampled_ids=sampled)
    assert assistant_closing_text(tokenizer) == "<|im_end|>\n"
    assert (
        tokenizer.decode(tail)
        == "<|im_end|>\n<|im_start|>user\nMore.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_errors_become_config_errors(tokenizer: Any) -> None:
    from areal_agents.errors import ConfigError

    class Broken:
        chat_template = (  # renders tools (so it is used), but fails on one message
            "{% if messages[-1]['content'] == 'boom' %}{{ raise_exception('boom') }}{% endif %}"
            "{% for t in tools or [] %}{{ t['function']['name'] }}{% endfor %}"
        )
        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            return tokenizer.apply_chat_template(conversation, **kwargs)

    broken = Broken()
    assert supports_tools(broken)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot render"):
        render_prompt(broken, [Message.user("boom")], [])  # type: ignore[arg-type]
    # ...while messages without content render as empty text.
    assert "<|im_start|>user\n<|im_end|>" in render_prompt(tokenizer, [{"role": "user"}], [])
