r"""Pull the answer out of a model's text: ``\boxed{...}``, ``<answer>...</answer>``, code blocks.

>>> extract_boxed(r"so \boxed{\frac{1}{2}} and finally \boxed{x^{2}}")
'x^{2}'
>>> extract_answer("I think <answer> Paris </answer>")
'Paris'
>>> extract_code("Here:\n```python\ndef f():\n    return 1\n```\n")
'def f():\n    return 1'
"""

from __future__ import annotations

import re

__all__ = [
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_code",
    "extract_code_blocks",
]

# Every function here is linear in the length of the text (model text is hostile: a reply of
# ``"<answer>" * 100_000`` or ``"\\boxed{" * 100_000`` must not take quadratic time).
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_FENCE_TAG = re.compile(r"[A-Za-z0-9_+-]*")
_PYTHON_TAGS = {"", "python", "py", "python3"}


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``), nested braces allowed.

    A ``\boxed{`` whose brace never closes is skipped in favour of the one before it.
    """
    starts = [m.end() for m in _BOXED_START.finditer(text)]
    if not starts:
        return None
    closing: dict[int, int] = {}  # position after each "{" -> position of its "}"
    stack: list[int] = []
    for m in _BRACE.finditer(text, starts[0] - 1):
        if m.group() == "{":
            stack.append(m.end())
        elif stack:
            closing[stack.pop()] = m.start()
    for start in reversed(starts):
        end = closing.get(start)
        if end is not None:
            return text[start:end].strip()
    return None


def extract_answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` (tags in any case)."""
    found = None
    pos = 0
    while (opening := _OPEN_TAG.search(text, pos)) is not None:
        closing = _CLOSE_TAG.search(text, opening.end())
        if closing is None:
            break
        found = text[opening.end() : closing.start()]
        pos = closing.end()
    return found.strip() if found is not None else None


def extract_answer(text: str, *, fallback_to_text: bool = False) -> str | None:
    r"""The final answer: last ``<answer>`` tag, else last ``\boxed{}``, else None (or the text)."""
    for found in (extract_answer_tag(text), extract_boxed(text)):
        if found is not None:
            return found
    if fallback_to_text and text.strip():
        return text.strip()
    return None


def extract_code_blocks(text: str, *, python_only: bool = True) -> list[str]:
    """All fenced code blocks, in order; by default only untagged and Python ones.

    A block opens with a line that starts with a fence (its tag is the first word after it)
    and ends at the next fence. An unterminated last block counts (generation may stop
    before the closing fence).
    """
    blocks = []
    pos = 0
    while (fence := text.find("```", pos)) >= 0:
        newline = text.find("\n", fence + 3)
        if newline < 0:
            break
        header = text[fence + 3 : newline].lstrip(" \t")
        tag_match = _FENCE_TAG.match(header)
        tag = tag_match.group().lower() if tag_match else ""
        end = text.find("```", newline + 1)
        body = text[newline + 1 :] if end < 0 else text[newline + 1 : end]
        pos = len(text) if end < 0 else end + 3
        if python_only and tag not in _PYTHON_TAGS:
            continue
        blocks.append(body.rstrip())
    return blocks


def extract_code(text: str) -> str | None:
    """The last fenced Python code block in ``text``, or None."""
    blocks = [b for b in extract_code_blocks(text) if b.strip()]
    return blocks[-1] if blocks else None
