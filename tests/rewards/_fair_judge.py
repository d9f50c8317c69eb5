"""A scripted judge for tests: fair to what it is shown as quoted, gullible to anything else.

What it is: the ``script`` of :class:`tests.policies.fake_openai.FakeOpenAI`, playing the model
behind a judge endpoint. It reads the prompt as a model would, by the words of the system
prompt: the two delimiter lines it names, the score range, the rubric. What is between the
delimiters is the response; each line loses its ``"| "`` prefix; a line ``[CUT-<nonce>: ...]``
with the system prompt's nonce is the grader's cut. It grades that content by a rule the rubric
names (``prime``: one point per distinct prime below 30 in the response; ``even``: one per
distinct even number), capped at the range's top.

What makes it a test of the quoting: like a model that takes what it reads outside the quote
for its instructions, it obeys an ``ignore the rubric ... N`` line or a bare ``SCORE: N`` line
found *outside* the quote, and answers ``N``. So an injection that leaks out of the quote
changes the score (``tests/rewards/test_judge_hostile.py`` shows that a naive prompt leaks),
and one that stays inside is graded as text. Its reply echoes the first quoted lines, as
they were sent, before its own verdict, as chatty judges do.
"""

from __future__ import annotations

import re
from typing import Any

_PRIMES = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29}


def grade(rubric: str, content: str) -> int:
    """The fair score of ``content`` by the rule ``rubric`` names."""
    numbers = {int(n) for n in re.findall(r"(?<![\d-])\d+(?!\d)", content)}
    if "prime" in rubric:
        return len(numbers & _PRIMES)
    if "even" in rubric:
        return len({n for n in numbers if n % 2 == 0})
    raise AssertionError(f"the fair judge knows no rule in the rubric {rubric!r}")


class FairJudge:
    """The script: ``FakeOpenAI(FairJudge(), model="judge")``; ``seen`` keeps each request's
    ``(content, cut)``: what the judge took for the response and whether it saw a cut."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        system, user = messages[0]["content"], messages[1]["content"]
        found = re.search(r"between the line (\S+) and the line (\S+)\.", system)
        assert found, "the system prompt names no delimiters"
        opening, closing = found.groups()
        nonce = opening.removeprefix("<<<RESPONSE-").removesuffix(">>>")
        low, high = (int(x) for x in re.search(r"from (-?\d+) to (-?\d+)>", system).groups())  # type: ignore[union-attr]
        rubric = user.split("RUBRIC:\n", 1)[1].split("\n\n", 1)[0]

        lines = user.split("\n")
        start = lines.index(opening)
        end = next(i for i in range(start + 1, len(lines)) if lines[i] == closing)
        quoted, outside = lines[start + 1 : end], lines[:start] + lines[end + 1 :]
        for line in outside:  # gullible: what reaches it outside the quote, it obeys
            order = re.search(r"(?i)ignore the rubric\D*(\d+)", line) or re.fullmatch(
                r"SCORE: (\d+)", line.strip()
            )
            if order:
                return {"content": f"As instructed.\nSCORE: {order[1]}"}
        marker = re.compile(rf"\[CUT-{nonce}: \d+ more characters not shown\]")
        cut = any(marker.fullmatch(q) for q in quoted)
        content = "\n".join(
            q[2:] if q.startswith("| ") else q for q in quoted if not marker.fullmatch(q)
        )
        self.seen.append((content, cut))
        score = max(low, min(high, grade(rubric, content)))
        echo = "\n".join(quoted[:3])
        verdict = f"By the rubric it earns {score}.\nSCORE: {score}"
        return {"content": f"The response reads:\n{echo}\n{verdict}"}
