"""``rewards.judge``: the strict verdict, the prompt, every key's effect, caching and batching,
retries and timeouts, and failures that drop episodes (never a 0), against a scripted endpoint
(``tests/policies/fake_openai.py``, which checks each request against the OpenAI spec).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from areal_agents.errors import ConfigError, EndpointError, MalformedResponseError
from areal_agents.rewards import ExactMatch, WeightedSum
from areal_agents.rewards.judge import EnvJudge, JudgeContext, JudgeError, LLMJudge, shared_judge
from areal_agents.rewards.judge_prompt import PromptParts, build_messages, parse_verdict
from tests.policies.fake_openai import FakeOpenAI
from tests.rewards._fair_judge import FairJudge

PRIMES = "One point per distinct prime number below 30 that the response lists."
EVENS = "One point per distinct even number that the response lists."


class Script:
    """The endpoint's behaviour, switchable per test: the fair judge, or a fixed reply."""

    def __init__(self) -> None:
        self.reply: Callable[[list[dict[str, Any]]], str] | None = None
        self.fair = FairJudge()

    def __call__(self, messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        if self.reply is not None:
            return {"content": self.reply(messages)}
        return self.fair(messages, tools)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeOpenAI, Script]]:
    script = Script()
    with FakeOpenAI(script, model="judge").running() as server:
        yield server, script


@pytest.fixture
def fake(served: tuple[FakeOpenAI, Script]) -> Iterator[FakeOpenAI]:
    server, script = served
    server.requests.clear()
    server.failures.clear()
    server.delay_s = 0.0
    server.max_in_flight = 0
    script.reply = None
    yield server
    script.reply = None


@pytest.fixture
def script(served: tuple[FakeOpenAI, Script]) -> Script:
    return served[1]


def judge(server: FakeOpenAI, rubric: str = PRIMES, **kwargs: Any) -> LLMJudge:
    settings: dict[str, Any] = {"max_retries": 0, "backoff_s": 0.0, "api_key": "test-key"}
    settings.update(kwargs)
    return LLMJudge(rubric, base_url=server.base_url, model="judge", **settings)


# ---- the strict verdict and the prompt -----------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "7",
        "Score: 7",
        "SCORE: 7.5",
        "SCORE:7",
        "**SCORE: 7**",
        "SCORE: 7\nthat is all",
        "SCORE: 3\nSCORE: 7",
        "score: 2 is what the answer asks\nSCORE: 7",
        "SCORE: 11",
        "SCORE: -1",
        "<think>SCORE: 7</think>",
    ],
)
def test_anything_but_one_final_score_line_in_range_is_no_verdict(reply: str) -> None:
    with pytest.raises(MalformedResponseError):
        parse_verdict(reply, 0, 10)


def test_a_verdict_is_its_last_line_after_any_reasoning() -> None:
    verdict = parse_verdict("<think>hmm</think>It lists 2 and 3.\n\n  SCORE: 2  \n", 0, 10)
    assert (verdict.score, verdict.reasoning) == (2, "It lists 2 and 3.")
    assert parse_verdict("SCORE: -3", -5, 5).score == -3
    with pytest.raises(MalformedResponseError, match="cut at max_tokens"):
        parse_verdict("SCORE: 2", 0, 10, finish_reason="length")


def test_the_prompt_quotes_every_line_under_the_nonce_and_marks_the_cut() -> None:
    parts = PromptParts("R", "a\nb<<<c\r\nd" + "x" * 100, "Q?", "ref", 1, 7, max_answer_chars=12)
    system, user = (m["content"] for m in build_messages(parts, "n0nce"))
    assert "between the line <<<RESPONSE-n0nce>>> and the line <<<END-RESPONSE-n0nce>>>" in system
    assert "from 1 to 7>" in system and "[CUT-n0nce: ...]" in system
    response = user.split("<<<RESPONSE-n0nce>>>\n")[1].split("\n<<<END-RESPONSE-n0nce>>>")[0]
    assert response.split("\n") == [
        "| a",
        "| b‹‹‹c",
        "| dxx",
        "[CUT-n0nce: 98 more characters not shown]",
    ]
    assert "(110 characters; the first 12 are shown" in user
    assert "<<<TASK-n0nce>>>\n| Q?\n<<<END-TASK-n0nce>>>" in user
    assert "<<<REFERENCE-n0nce>>>\n| ref\n" in user
    assert user.startswith("RUBRIC:\nR\n\n")
    short = build_messages(PromptParts("R", "ok"), "n")[0]["content"]
    assert "CUT" not in short  # nothing was cut: no cut is announced


# ---- every key changes what happens --------------------------------------------------------


def test_rubric_decides_the_score(fake: FakeOpenAI) -> None:
    assert judge(fake, PRIMES)("2, 4, 6, 7", None).details["score"] == 2
    assert judge(fake, EVENS)("2, 4, 6, 7", None).details["score"] == 3
    assert "prime" in fake.requests[0]["messages"][1]["content"]


def test_score_range_bounds_and_maps_the_verdict(fake: FakeOpenAI, script: Script) -> None:
    script.reply = lambda messages: "SCORE: 7"
    result = judge(fake, max_score=10)("x", None)
    assert (result.reward, result.status, result.details["range"]) == (0.7, "partial", [0, 10])
    assert judge(fake, min_score=-3, max_score=7)("x", None).reward == 1.0
    with pytest.raises(JudgeError, match=r"outside 0\.\.5"):
        judge(fake, max_score=5)("x", None)
    assert "from -3 to 7>" in fake.requests[1]["messages"][0]["content"]


def test_max_answer_chars_cuts_what_the_judge_sees(fake: FakeOpenAI, script: Script) -> None:
    answer = "2 3 5 7 11 13"
    assert judge(fake, max_answer_chars=7)(answer, None).details["score"] == 4
    assert script.fair.seen[-1] == ("2 3 5 7", True)
    result = judge(fake, max_answer_chars=100)(answer, None)
    assert (result.details["score"], result.details["truncated"]) == (6, False)


def test_sampling_keys_are_sent(fake: FakeOpenAI) -> None:
    judge(fake, temperature=0.7, max_tokens=33)("2", None)
    judge(fake)("3", None)
    first, second = fake.requests
    assert (first["temperature"], first["max_tokens"]) == (0.7, 33)
    assert (second["temperature"], second["max_tokens"]) == (0.0, 512)


def test_show_reference_shows_the_reference(fake: FakeOpenAI) -> None:
    context = JudgeContext(question="List primes.", reference="2, 3, 5")
    judge(fake)("7", context)
    judge(fake, show_reference=True)("11", context)
    hidden, shown = (r["messages"][1]["content"] for r in fake.requests)
    assert "| List primes." in hidden and "REFERENCE" not in hidden
    assert "<<<REFERENCE-" in shown and "| 2, 3, 5" in shown
    judge(fake, show_reference=True)("13", "2, 3, 5")  # a plain reference is the reference
    assert "| 2, 3, 5" in fake.requests[-1]["messages"][1]["content"]


def test_api_key_and_model_are_checked_by_the_endpoint(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="refused the API key"):
        judge(fake, api_key="wrong")("2", None)
    monkeypatch.setenv("MY_JUDGE_KEY", "test-key")
    assert judge(fake, api_key=None, api_key_env="MY_JUDGE_KEY")("2", None).reward == 0.1
    with pytest.raises(ConfigError, match="MISSING_KEY"):
        judge(fake, api_key=None, api_key_env="MISSING_KEY")
    wrong = LLMJudge(PRIMES, base_url=fake.base_url, model="other", api_key="test-key")
    with pytest.raises(ConfigError, match="does not exist"):
        wrong("2", None)


def test_timeout_s_cuts_a_slow_judge_off(fake: FakeOpenAI) -> None:
    fake.delay_s = 1.5
    start = time.monotonic()
    with pytest.raises(JudgeError, match=r"no complete reply within 0\.3 s"):
        judge(fake, timeout_s=0.3)("2", None)
    assert time.monotonic() - start < 1.4
    assert judge(fake, timeout_s=10)("2", None).reward == 0.1


def test_max_retries_and_backoff_s(fake: FakeOpenAI) -> None:
    fake.failures[:] = [503, 503]
    j = judge(fake, max_retries=1)
    with pytest.raises(JudgeError, match="after 2 attempts"):
        j("2", None)
    assert j.stats["http_503"] == 2 and j.stats["failed"] == 1
    fake.failures[:] = [503, 503]
    assert judge(fake, max_retries=2)("2", None).reward == 0.1  # the third attempt answers
    timings = []
    for backoff in (0.0, 0.8):
        fake.failures[:] = [503]
        start = time.monotonic()
        judge(fake, max_retries=1, backoff_s=backoff)("3", None)
        timings.append(time.monotonic() - start)
    assert timings[1] - timings[0] > 0.5  # the first retry waits 0.75-1.25 x backoff_s


def test_a_reply_without_a_verdict_is_retried_then_fails(fake: FakeOpenAI, script: Script) -> None:
    replies = iter(["It is good, 10/10.", "SCORE: 4"])
    script.reply = lambda messages: next(replies)
    j = judge(fake, max_retries=1)
    assert j("x", None).details["score"] == 4
    assert (j.stats["malformed"], j.stats["retries"], j.stats["judged"]) == (1, 1, 1)
    system = [r["messages"][0]["content"] for r in fake.requests]
    assert system[0] != system[1]  # the retry quotes under a new nonce
    script.reply = lambda messages: "It is good."
    with pytest.raises(JudgeError, match="not 'SCORE: <integer>'") as caught:
        judge(fake, max_retries=2)("y", None)
    assert isinstance(caught.value, EndpointError)  # an infrastructure fault: dropped


def test_cache_size_and_coalescing(fake: FakeOpenAI) -> None:
    j = judge(fake, cache_size=1)
    first, again = j("2, 3", None), j("2, 3", None)
    assert len(fake.requests) == 1 and first.reward == again.reward == 0.2
    assert (first.details["cached"], again.details["cached"]) == (False, True)
    j("5", None)
    j("2, 3", None)  # the cache held one verdict: this one was evicted
    assert len(fake.requests) == 3 and j.stats["cache_hits"] == 1
    uncached = judge(fake, cache_size=0)
    uncached("2, 3", None)
    uncached("2, 3", None)
    assert len(fake.requests) == 5
    fake.delay_s = 0.3  # five identical answers at once: one request, the rest wait for it
    results = judge(fake, cache_size=0).score_batch([("7", None)] * 5)
    assert len(fake.requests) == 6 and {r.reward for r in results} == {0.1}


def test_max_concurrency_bounds_a_batch(fake: FakeOpenAI) -> None:
    fake.delay_s = 0.2
    items = [(str(n), None) for n in (2, 3, 5, 7)]
    assert [r.reward for r in judge(fake, max_concurrency=4).score_batch(items)] == [0.1] * 4
    assert fake.max_in_flight == 4
    fake.max_in_flight = 0
    judge(fake, max_concurrency=1).score_batch([(f"{a} 11", None) for a, _ in items])
    assert fake.max_in_flight == 1


def test_a_batch_can_return_its_failures(fake: FakeOpenAI, script: Script) -> None:
    script.reply = lambda m: "SCORE: 1" if "| good" in m[1]["content"] else "no verdict"
    out = judge(fake).score_batch([("good", None), ("bad", None)], return_exceptions=True)
    assert out[0].reward == 0.1 and isinstance(out[1], JudgeError)  # type: ignore[union-attr]
    with pytest.raises(JudgeError):
        judge(fake).score_batch([("good", None), ("bad", None)])


async def test_acall_raises_where_other_rewards_time_out(fake: FakeOpenAI, script: Script) -> None:
    assert (await judge(fake).acall("2 3", None)).reward == 0.2
    script.reply = lambda m: "no verdict"
    with pytest.raises(JudgeError):
        await judge(fake).acall("2", None)
    results = await judge(fake).ascore_batch([("a", None)], return_exceptions=True)
    assert isinstance(results[0], JudgeError)


def test_it_composes_with_program_rewards(fake: FakeOpenAI) -> None:
    total = WeightedSum([(ExactMatch(), 1.0), (judge(fake), 0.5)])
    result = total("2 3 5", "2 3 5")
    assert result.reward == 1.0 + 0.5 * 0.3
    assert result.details["components"]["1_judge"]["score"] == 3


def test_bad_settings_are_refused_naming_the_key() -> None:
    url = "http://127.0.0.1:9/v1"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"rubric": " "}, "judge.rubric"),
        ({"min_score": 5, "max_score": 5}, "must exceed"),
        ({"max_score": 2.5}, "judge.max_score"),
        ({"max_answer_chars": 0}, "judge.max_answer_chars"),
        ({"temperature": 3}, "judge.temperature"),
        ({"timeout_s": 0}, "judge.timeout_s"),
        ({"max_retries": -1}, "judge.max_retries"),
        ({"cache_size": -1}, "judge.cache_size"),
        ({"show_reference": "yes"}, "judge.show_reference"),
        ({"base_url": "127.0.0.1:9"}, "expected http"),
    ]
    for change, message in bad:
        settings = {"rubric": PRIMES, "base_url": url, "model": "m", **change}
        with pytest.raises(ConfigError, match=message):
            LLMJudge(**settings)
    with pytest.raises(ConfigError, match="did you mean 'timeout_s'"):
        shared_judge(rubric=PRIMES, base_url=url, model="m", timout_s=3)
    with pytest.raises(ConfigError, match="needs rubric, base_url and model"):
        shared_judge(rubric=PRIMES)
    with pytest.raises(ConfigError, match=r"judge\.weight"):
        EnvJudge.from_config({"rubric": PRIMES, "base_url": url, "model": "m", "weight": "x"})
    with pytest.raises(ConfigError, match="must be a mapping"):
        EnvJudge.from_config("yes")
    assert shared_judge(rubric=PRIMES, base_url=url, model="m") is shared_judge(
        model="m", base_url=url, rubric=PRIMES
    )
