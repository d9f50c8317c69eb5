"""Chat templates with tools, and the token-exact rendering the token client relies on.

A model's own chat template is used when it renders tool schemas. Otherwise (SmolLM2's template
is plain ChatML without tools) areal_agents' own ChatML template with Hermes-style
``<tool_call>`` blocks is used: ``chatml_tools.jinja`` next to this file.

Multi-turn training must see exactly the tokens the policy sampled, so a conversation is
rendered once, and each later turn only *appends*: the sampled ids, then the template's tokens
for the new tool/user messages (:func:`continuation_ids`). Nothing already sampled is ever
re-tokenised.

>>> from transformers import AutoTokenizer
>>> from areal_agents.serving.model import default_model_path
>>> from areal_agents.types import Message
>>> tokenizer = AutoTokenizer.from_pretrained(default_model_path())
>>> print(render_prompt(tokenizer, [Message.system("Be brief."), Message.user("Hi")], []))
<|im_start|>system
Be brief.<|im_end|>
<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
<BLANKLINE>
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from areal_agents.errors import ConfigError
from areal_agents.types import Message, ToolSpec

__all__ = [
    "TOOL_TEMPLATE_PATH",
    "ChatTokenizer",
    "assistant_closing_text",
    "chat_template_for",
    "continuation_ids",
    "render_prompt",
    "render_prompt_ids",
    "supports_tools",
    "template_messages",
    "template_tools",
    "tool_chat_template",
]

#: areal_agents' ChatML template with tools (Hermes-style ``<tool_call>`` blocks).
TOOL_TEMPLATE_PATH = Path(__file__).with_name("chatml_tools.jinja")

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "areal_probe_tool_x7",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}
_PROBE_TEXT = "AREAL_PROBE_ASSISTANT_TEXT"


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer that rendering needs."""

    chat_template: Any
    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Any, **kwargs: Any) -> str: ...

    def convert_ids_to_tokens(self, ids: Any) -> Any: ...


@functools.cache
def tool_chat_template() -> str:
    """The text of areal_agents' ChatML tool template."""
    return TOOL_TEMPLATE_PATH.read_text()


def supports_tools(tokenizer: ChatTokenizer, template: str | None = None) -> bool:
    """Whether ``template`` (default: the tokenizer's) renders the tool schemas it is given."""
    template = template if template is not None else tokenizer.chat_template
    if not isinstance(template, str) or "tools" not in template:
        return False
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}],
            tools=[_PROBE_TOOL],
            chat_template=template,
            tokenize=False,
        )
    except Exception:
        return False
    return isinstance(text, str) and "areal_probe_tool_x7" in text


def chat_template_for(tokenizer: ChatTokenizer) -> str:
    """The tokenizer's template when it renders tools, else areal_agents' ChatML tool template."""
    own = tokenizer.chat_template
    if isinstance(own, str) and _cached_supports(tokenizer, own):
        return own
    return tool_chat_template()


def _cached_supports(tokenizer: ChatTokenizer, template: str) -> bool:
    cache: dict[str, bool] = tokenizer.__dict__.setdefault("_areal_supports_tools", {})
    if template not in cache:
        cache[template] = supports_tools(tokenizer, template)
    return cache[template]


def template_messages(messages: Sequence[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the dicts chat templates read (OpenAI format; ``content`` always a string)."""
    out = []
    for m in messages:
        data = m.to_openai() if isinstance(m, Message) else dict(m)
        if data.get("content") is None:
            data["content"] = ""
        out.append(data)
    return out


def template_tools(tools: Sequence[ToolSpec | Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Tool schemas in the OpenAI ``tools`` format."""
    return [t.to_openai() if isinstance(t, ToolSpec) else dict(t) for t in tools or ()]


def render_prompt(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message | Mapping[str, Any]],
    tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The conversation as prompt text; tool schemas rendered by a tool-capable template."""
    tool_list = template_tools(tools)
    try:
        text = tokenizer.apply_chat_template(
            template_messages(messages),
            tools=tool_list or None,
            chat_template=chat_template_for(tokenizer),
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    except Exception as e:  # jinja errors on malformed messages or schemas
        raise ConfigError(f"cannot render the conversation with the chat template: {e}") from e
    if not isinstance(text, str):
        raise ConfigError(f"chat template rendered {type(text).__name__}, expected text")
    return text


def render_prompt_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message | Mapping[str, Any]],
    tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The conversation as prompt token ids (the template writes every special token itself)."""
    text = render_prompt(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def assistant_closing_text(tokenizer: ChatTokenizer) -> str:
    """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
    template = chat_template_for(tokenizer)
    cache: dict[str, str] = tokenizer.__dict__.setdefault("_areal_closing", {})
    if template not in cache:
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE_TEXT}]
        text = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False)
        cut = text.rfind(_PROBE_TEXT)
        if cut < 0:
            raise ConfigError("the chat template drops assistant content; cannot render turns")
        cache[template] = text[cut + len(_PROBE_TEXT) :]
    return cache[template]


def continuation_ids(
    tokenizer: ChatTokenizer,
    prior: Sequence[Message | Mapping[str, Any]],
    new: Sequence[Message | Mapping[str, Any]],
    tools: Sequence[ToolSpec | Mapping[str, Any]] | None,
    *,
    sampled_ids: Sequence[int],
    add_generation_prompt: bool = True,
) -> list[int]:
    """Tokens to append after a sampled assistant turn so that the context continues with ``new``.

    ``prior`` is the conversation up to and including that assistant turn, whose sampled tokens
    were ``sampled_ids``. The result closes the turn (only the part of the template's closing
    that the model did not generate itself: with an end-of-turn token sampled, just the
    newline) and renders ``new`` (tool results, a user message) plus the generation prompt.
    """
    before = render_prompt(tokenizer, prior, tools, add_generation_prompt=False)
    after = render_prompt(
        tokenizer, [*prior, *new], tools, add_generation_prompt=add_generation_prompt
    )
    if not after.startswith(before):
        raise ConfigError(
            "the chat template is not prefix-preserving (appending messages changed how earlier "
            "ones render); token-level multi-turn rollouts need one that is"
        )
    closing = assistant_closing_text(tokenizer)
    if sampled_ids:
        last = tokenizer.decode([int(sampled_ids[-1])], skip_special_tokens=False)
        if last and closing.startswith(last):
            closing = closing[len(last) :]
    return list(tokenizer.encode(closing + after[len(before) :], add_special_tokens=False))
