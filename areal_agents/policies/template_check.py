"""The chat-template gate: is a template prefix-preserving over a multi-turn tool dialogue?

Token-faithful rollouts (:func:`~areal_agents.policies.templates.continuation_ids`) never
re-render what the policy sampled: after each assistant turn they append the template's
rendering of the new messages. That is only right when rendering more messages leaves the
rendering of the earlier ones unchanged. Templates that rewrite history break it, most often
by dropping the ``<think>`` blocks of earlier assistant turns (Qwen3's template does). Such a
template would stop a run at its first multi-turn episode; :func:`check_chat_template` finds it
before anything starts, by rendering every prefix of :data:`PROBE_DIALOGUE` (tools, two tool
rounds with reasoning, a follow-up question) and checking that each is a prefix of the next.

``model.chat_template`` chooses the template (:func:`resolve_chat_template`): the model's own
(default; areal_agents' ChatML tool template when the model's renders no tools),
``chatml_tools`` (that template), ``trl`` (TRL's training version of the model's template,
from ``trl.chat_template_utils``) or a Jinja file.

>>> from transformers import AutoTokenizer
>>> from areal_agents.serving.model import default_model_path
>>> tokenizer = AutoTokenizer.from_pretrained(default_model_path())
>>> prefix_violation(tokenizer, resolve_chat_template(tokenizer, None)) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_agents.errors import ConfigError
from areal_agents.policies.templates import ChatTokenizer, chat_template_for, tool_chat_template

__all__ = [
    "CHAT_TEMPLATE_KEY",
    "PROBE_DIALOGUE",
    "PROBE_TOOLS",
    "check_chat_template",
    "prefix_violation",
    "resolve_chat_template",
]

#: The configuration key that chooses the template.
CHAT_TEMPLATE_KEY = "model.chat_template"

PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def _call(i: int, expression: str) -> dict[str, Any]:
    arguments = json.dumps({"expression": expression})
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "calculator", "arguments": arguments},
    }


#: A multi-turn tool dialogue with reasoning in every assistant turn.
PROBE_DIALOGUE: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful assistant. Use the tools."},
    {"role": "user", "content": "What is 12 * 7?"},
    {
        "role": "assistant",
        "content": "<think>\nI should use the calculator.\n</think>\n\nLet me compute it.",
        "tool_calls": [_call(0, "12 * 7")],
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "84"},
    {"role": "assistant", "content": "<think>\nThe tool says 84.\n</think>\n\n\\boxed{84}"},
    {"role": "user", "content": "And 84 + 1?"},
    {
        "role": "assistant",
        "content": "<think>\nOne more call.\n</think>\n\n",
        "tool_calls": [_call(1, "84 + 1")],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "85"},
    {"role": "assistant", "content": "<think>\nDone.\n</think>\n\n\\boxed{85}"},
]


def resolve_chat_template(tokenizer: ChatTokenizer, choice: str | None) -> str:
    """The template text ``model.chat_template=choice`` names for this tokenizer's model.

    ``None``: the model's own when it renders tools, else areal_agents' ChatML tool template
    (what every engine uses by default); ``chatml_tools``: that template; ``trl``: TRL's
    training version of the model's template; anything else: a Jinja file.
    """
    if choice is None:
        return chat_template_for(tokenizer)
    if choice == "chatml_tools":
        return tool_chat_template()
    if choice == "trl":
        return _trl_template(tokenizer) or _refuse(
            "TRL has no training version of this model's template; use chatml_tools or a file"
        )
    path = Path(choice).expanduser()
    if not path.is_file():
        _refuse(f"{choice!r} is not chatml_tools, trl or a Jinja file")
    return path.read_text()


def _refuse(reason: str) -> str:
    raise ConfigError(f"{CHAT_TEMPLATE_KEY}: {reason}")


def _trl_template(tokenizer: ChatTokenizer) -> str | None:
    """TRL's prefix-preserving training template for this tokenizer's template, if TRL has one."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        return None
    try:
        template = get_training_chat_template(tokenizer)  # type: ignore[arg-type]
    except Exception:  # a template TRL does not know
        return None
    own = tokenizer.chat_template
    return template if template is not None else (own if isinstance(own, str) else None)


def _render(tokenizer: ChatTokenizer, template: str, messages: Sequence[dict[str, Any]]) -> str:
    generation = messages[-1]["role"] != "assistant"
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=PROBE_TOOLS,
        chat_template=template,
        add_generation_prompt=generation,
        tokenize=False,
    )
    return str(text)


def prefix_violation(tokenizer: ChatTokenizer, template: str) -> str | None:
    """Where ``template`` stops being prefix-preserving on :data:`PROBE_DIALOGUE` (None: never).

    Each conversation that ends after an assistant turn is rendered as it stands, and each one
    that ends before an assistant turn with the generation prompt; every rendering must be a
    prefix of the next one, as token-level rollouts assume.
    """
    previous: tuple[int, str] | None = None
    for end in range(2, len(PROBE_DIALOGUE) + 1):
        here = PROBE_DIALOGUE[:end]
        ends_turn = here[-1]["role"] == "assistant"
        before_turn = end < len(PROBE_DIALOGUE) and PROBE_DIALOGUE[end]["role"] == "assistant"
        if not (ends_turn or before_turn):
            continue
        try:
            text = _render(tokenizer, template, here)
        except Exception as e:
            return f"it cannot render the dialogue's first {end} messages: {e}"
        if previous is not None and not text.startswith(previous[1]):
            k, old = previous
            pairs = enumerate(zip(old, text, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), len(old))
            roles = ", ".join(m["role"] for m in PROBE_DIALOGUE[k:end])
            return (
                f"adding [{roles}] to the first {k} messages changed how those render "
                f"(at character {at}: {old[at : at + 40]!r} became {text[at : at + 40]!r})"
            )
        previous = (end, text)
    return None


def check_chat_template(tokenizer: ChatTokenizer, choice: str | None, model: str) -> str:
    """The template ``choice`` gives ``model``, after checking it; raises :class:`ConfigError`
    naming ``model.chat_template`` and the training-safe alternatives when it fails."""
    template = resolve_chat_template(tokenizer, choice)
    problem = prefix_violation(tokenizer, template)
    if problem is None:
        return template
    offers = [f"{CHAT_TEMPLATE_KEY}=chatml_tools (areal_agents' ChatML template with tools)"]
    trl = _trl_template(tokenizer) if choice != "trl" else None
    if trl is not None and trl != template and prefix_violation(tokenizer, trl) is None:
        offers.append(f"{CHAT_TEMPLATE_KEY}=trl (TRL's training version of this template)")
    which = "the model's own" if choice is None else repr(choice)
    raise ConfigError(
        f"{CHAT_TEMPLATE_KEY}: {which} chat template of model={model} is not prefix-preserving "
        f"over a multi-turn tool dialogue: {problem}. Token-level rollouts append to what the "
        "policy sampled and never re-render it, so the run would fail at its first multi-turn "
        "episode. Use a training-safe template: " + " or ".join(offers)
    )
