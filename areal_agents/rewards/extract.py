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

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``), nested braces allowed."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>``."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


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

    An unterminated last block counts (generation may stop before the closing fence).
    """
    blocks = []
    for match in _FENCE.finditer(text):
        tag = match.group(1).lower()
        if python_only and tag not in _PYTHON_TAGS:
            continue
        blocks.append(match.group(2).rstrip())
    return blocks


def extract_code(text: str) -> str | None:
    """The last fenced Python code block in ``text``, or None."""
    blocks = [b for b in extract_code_blocks(text) if b.strip()]
    return blocks[-1] if blocks else None
