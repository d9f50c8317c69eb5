r"""``rewards.judge``: a rubric scored by a model behind any OpenAI-compatible endpoint.

:class:`LLMJudge` is a :class:`~areal_agents.rewards.base.Reward`: ``judge(answer, reference)``
asks the endpoint (vLLM, the built-in server, a hosted API) to grade ``answer`` by a rubric and
returns the score mapped onto [0, 1] (``details["score"]`` keeps the judge's integer). It
composes with the program rewards (``WeightedSum([(MathEquivalence(), 1.0), (judge, 0.5)])``,
``FormatGate(BoxedFormat(), judge)``), and every built-in environment takes one through its
``judge`` keyword (:class:`EnvJudge`): ``gym.make(id, judge={"base_url": ..., "model": ...,
"rubric": ...})``, ``python -m areal_agents.eval env_kwargs={judge: {...}}``,
``python -m areal_agents.train env.kwargs.judge.rubric=...``. The environment's own reward and
the judge's are then summed, ``program_weight * program + weight * judge``, with both results
in ``info["reward_details"]["components"]``.

Not to be confused with ``rewards/_judge.py``: that is the host-side judge of
``code_sandbox``'s unit tests (it compares the values a program returned in the sandbox
against the expected ones; no model involved).

**Failures are infrastructure faults, never a score.** Each request has a deadline
(``timeout_s``) and is retried ``max_retries`` times with backoff: on a timeout, a connection
error, 429/5xx, a malformed body, *and a reply that is not a strict verdict*
(:mod:`~areal_agents.rewards.judge_prompt`). After that :class:`JudgeError` (an
:class:`~areal_agents.errors.EndpointError`) is raised: the episode is dropped and counted by
evaluation (``dropped_by_kind: {"JudgeError": n}``) and by the trainer
(``dropped_episodes``), never scored 0. A refused API key or an unknown model is a
:class:`~areal_agents.errors.ConfigError`: retrying cannot fix it.

**The policy cannot instruct the judge**: the answer is quoted under a per-request random
delimiter, every line of it prefixed, long answers cut with a marker the answer cannot forge,
and the verdict parsed from one strict last line (see :mod:`~areal_agents.rewards.judge_prompt`,
which also says what the endpoint is trusted with: the verdict, nothing else).

**Batched and cached.** All judges of a process send their requests from one event loop in a
background thread, through one connection pool per judge, at most ``max_concurrency`` at once:
the episodes of a group or an evaluation are judged concurrently, and :meth:`LLMJudge.
score_batch` judges a list at once. Verdicts are cached per (rubric, task, shown reference,
answer) — identical answers, frequent in a group, cost one request — and an identical request
already in flight is awaited rather than sent twice. Environments share one judge per
configuration (:func:`shared_judge`), so the cache spans episodes.

>>> judge = LLMJudge("10 if the answer names a prime, else 0", base_url="http://127.0.0.1:9/v1",
...                  model="judge", max_score=10)
>>> judge.normalize(7)
0.7
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import inspect
import json
import math
import os
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import openai

from areal_agents.errors import ConfigError, EndpointError, did_you_mean
from areal_agents.policies.chat_response import parse_chat_completion
from areal_agents.policies.openai_client import ClientSettings, EndpointClient, read_body
from areal_agents.rewards.base import Reward, RewardResult
from areal_agents.rewards.compose import combine
from areal_agents.rewards.judge_prompt import PromptParts, Verdict, build_messages, new_nonce
from areal_agents.rewards.judge_prompt import parse_verdict as _parse_verdict

__all__ = ["EnvJudge", "JudgeContext", "JudgeError", "LLMJudge", "shared_judge"]

T = TypeVar("T")
_REASONING_CHARS = 1000  # of the judge's reasoning kept in the details
_COUNTS = ("judged", "cache_hits", "coalesced", "failed")  # always in LLMJudge.stats


class JudgeError(EndpointError):
    """The judge gave no verdict after its retries (an infrastructure fault: drop the episode)."""


@dataclass(frozen=True)
class JudgeContext:
    """What the judge may see besides the answer: the task, and a reference answer (shown
    only when the judge has ``show_reference=True``). Pass it as the ``reference`` argument;
    any other ``reference`` value is taken as the reference answer."""

    question: str | None = None
    reference: Any = None


# ---- one event loop per process, in a daemon thread, for every judge ------------------------


class _Loop:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="judge")
        self.thread.start()


_LOOP: _Loop | None = None
_LOOP_LOCK = threading.Lock()
_JUDGES: weakref.WeakSet[LLMJudge] = weakref.WeakSet()


def _judge_loop() -> asyncio.AbstractEventLoop:
    """The process's judge loop (a new one in a forked child, whose parent's thread is gone)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.pid != os.getpid():
            _LOOP = _Loop()
        return _LOOP.loop


@atexit.register
def _close_all() -> None:
    """Close every judge's connections on the loop, then stop it (no warnings at exit)."""
    if _LOOP is None or _LOOP.pid != os.getpid():
        return
    loop = _LOOP.loop

    async def close() -> None:
        await asyncio.gather(*(j.endpoint.aclose() for j in list(_JUDGES)), return_exceptions=True)

    with contextlib.suppress(Exception):  # exiting anyway
        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)


def _on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the judge loop and wait for it (from any thread but the loop's)."""
    loop = _judge_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("a judge called synchronously on its own loop: await judge.acall()")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def _await_on_loop(coro: Coroutine[Any, Any, T]) -> T:
    loop = _judge_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


# ---- the judge ------------------------------------------------------------------------------


def _int(key: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"judge.{key}={value!r}: must be an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(f"judge.{key}={value!r}: must be at least {minimum}")
    return value


def _number(key: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"judge.{key}={value!r}: must be a finite number")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"judge.{key}={value!r}: must be {'positive' if positive else '>= 0'}")
    return float(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"judge.{key}={value!r}: must be a non-empty string")
    return value


class LLMJudge(Reward):
    """Grade answers by ``rubric`` with the model ``model`` served at ``base_url``.

    Args:
        rubric: what earns which score, in words the judge reads (the range is added).
        base_url: the endpoint, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        api_key: the key; None reads the variable ``api_key_env`` names, else ``AREAL_API_KEY``
            / ``OPENAI_API_KEY`` (local servers need none).
        api_key_env: the environment variable holding the judge's key (keeps it out of
            configuration files, which runs save).
        min_score, max_score: the integer range of the verdict; the reward is
            ``(score - min_score) / (max_score - min_score)``.
        max_answer_chars: longer answers are cut, with a marker the judge is told about.
        max_tokens: the judge's reply budget; a reply cut there is no verdict (retried).
        temperature: the judge's sampling temperature (0: greedy).
        timeout_s: seconds one request may take in all, body included.
        max_retries: retries of a request (timeouts, 429/5xx, malformed replies, replies
            without a strict verdict) before :class:`JudgeError`.
        backoff_s: first retry delay; doubles on each retry (with jitter).
        max_concurrency: requests in flight at once through this judge.
        cache_size: verdicts kept (least recently used dropped first); 0: no cache.
        show_reference: whether the reference answer is shown to the judge.
        name: the component's name in composed details.
    """

    def __init__(
        self,
        rubric: str,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str | None = None,
        min_score: int = 0,
        max_score: int = 10,
        max_answer_chars: int = 4000,
        max_tokens: int = 512,
        temperature: float = 0.0,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_concurrency: int = 16,
        cache_size: int = 4096,
        show_reference: bool = False,
        name: str = "judge",
    ) -> None:
        self.rubric = _text("rubric", rubric)
        self.model = _text("model", model)
        self.min_score = _int("min_score", min_score)
        self.max_score = _int("max_score", max_score)
        if self.max_score <= self.min_score:
            raise ConfigError(f"judge: max_score={max_score} must exceed min_score={min_score}")
        self.max_answer_chars = _int("max_answer_chars", max_answer_chars, minimum=1)
        self.max_tokens = _int("max_tokens", max_tokens, minimum=1)
        self.temperature = _number("temperature", temperature)
        if self.temperature > 2:
            raise ConfigError(f"judge.temperature={temperature!r}: must be at most 2")
        self.cache_size = _int("cache_size", cache_size, minimum=0)
        if not isinstance(show_reference, bool):
            raise ConfigError(f"judge.show_reference={show_reference!r}: must be true or false")
        self.show_reference = show_reference
        self.name = _text("name", name)
        if api_key is None and api_key_env is not None:
            api_key = os.environ.get(_text("api_key_env", api_key_env))
            if not api_key:
                raise ConfigError(f"judge.api_key_env={api_key_env!r}: that variable is not set")
        try:
            settings = ClientSettings(
                base_url=_text("base_url", base_url),
                api_key=api_key,
                timeout=_number("timeout_s", timeout_s, positive=True),
                max_retries=_int("max_retries", max_retries, minimum=0),
                backoff_s=_number("backoff_s", backoff_s),
                max_concurrency=_int("max_concurrency", max_concurrency, minimum=1),
            )
        except ConfigError as e:
            raise ConfigError(f"judge: {e}") from None
        self.endpoint = EndpointClient(settings)
        self.timeout_s = settings.timeout
        self._stats: Counter[str] = Counter(dict.fromkeys(_COUNTS, 0))
        self._cache: OrderedDict[str, RewardResult] = OrderedDict()
        self._pending: dict[str, asyncio.Future[RewardResult]] = {}
        _JUDGES.add(self)

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.model!r}, base_url={self.endpoint.settings.base_url!r})"

    # ---- the public calls ---------------------------------------------------------------

    def normalize(self, score: int) -> float:
        """The reward of a verdict: ``score`` mapped from the range onto [0, 1]."""
        return round((score - self.min_score) / (self.max_score - self.min_score), 10)

    def __call__(self, response: str, reference: Any = None) -> RewardResult:
        """The verdict on ``response`` (blocks; raises :class:`JudgeError` when there is none)."""
        return _on_loop(self._score(self._parts(response, reference)))

    async def acall(self, response: str, reference: Any = None) -> RewardResult:
        """:meth:`__call__` for coroutines. Unlike other rewards', its failure raises (a judge
        that fails is no ``timeout`` score)."""
        return await _await_on_loop(self._score(self._parts(response, reference)))

    @overload
    def score_batch(
        self, items: Sequence[tuple[str, Any]], *, return_exceptions: Literal[False] = False
    ) -> list[RewardResult]: ...
    @overload
    def score_batch(
        self, items: Sequence[tuple[str, Any]], *, return_exceptions: Literal[True]
    ) -> list[RewardResult | BaseException]: ...
    def score_batch(
        self, items: Sequence[tuple[str, Any]], *, return_exceptions: bool = False
    ) -> list[RewardResult] | list[RewardResult | BaseException]:
        """Verdicts on ``(response, reference)`` pairs, requested concurrently (identical ones
        once). ``return_exceptions`` as in :func:`asyncio.gather`: a failure in its place
        instead of raised."""
        return _on_loop(self._batch(items, return_exceptions))

    async def ascore_batch(
        self, items: Sequence[tuple[str, Any]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """:meth:`score_batch` for coroutines."""
        return await _await_on_loop(self._batch(items, return_exceptions))

    @property
    def stats(self) -> dict[str, int]:
        """``judged`` (verdicts from the endpoint), ``cache_hits``, ``coalesced`` (waited for
        an identical request in flight), ``failed`` (:class:`JudgeError` raised), and the
        endpoint's ``attempts``, ``retries``, ``timeout``, ``malformed``, ``http_<status>``."""
        return {**self.endpoint.stats, **self._stats}

    def close(self) -> None:
        """Close this judge's connections (a later call opens new ones)."""
        _on_loop(self.endpoint.aclose())

    # ---- machinery ----------------------------------------------------------------------

    def _parts(self, response: Any, reference: Any) -> PromptParts:
        context = (
            reference if isinstance(reference, JudgeContext) else JudgeContext(None, reference)
        )
        shown = context.reference if self.show_reference else None
        return PromptParts(
            rubric=self.rubric,
            answer=response if isinstance(response, str) else str(response),
            question=context.question,
            reference=None if shown is None else str(shown),
            min_score=self.min_score,
            max_score=self.max_score,
            max_answer_chars=self.max_answer_chars,
        )

    def _key(self, parts: PromptParts) -> str:
        fields = [self.model, self.temperature, *vars(parts).values()]
        return hashlib.sha256(json.dumps(fields).encode("utf-8", "surrogatepass")).hexdigest()

    async def _batch(self, items: Sequence[tuple[str, Any]], return_exceptions: bool) -> list[Any]:
        jobs = [self._score(self._parts(response, reference)) for response, reference in items]
        return list(await asyncio.gather(*jobs, return_exceptions=return_exceptions))

    async def _score(self, parts: PromptParts) -> RewardResult:
        key = self._key(parts)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self._stats["cache_hits"] += 1
            return RewardResult(cached.reward, cached.status, {**cached.details, "cached": True})
        pending = self._pending.get(key)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            pending = asyncio.ensure_future(self._fetch(parts, key))
            self._pending[key] = pending
        else:
            self._stats["coalesced"] += 1
        return await asyncio.shield(pending)

    async def _fetch(self, parts: PromptParts, key: str) -> RewardResult:
        try:
            verdict = await self.endpoint.call("judge", lambda client: self._ask(client, parts))
        except EndpointError as e:
            self._stats["failed"] += 1
            raise JudgeError(f"judge {self.model!r} gave no verdict: {e}") from e
        finally:
            self._pending.pop(key, None)
        self._stats["judged"] += 1
        reward = self.normalize(verdict.score)
        status = "correct" if reward >= 1.0 else "wrong" if reward <= 0.0 else "partial"
        details = {
            "score": verdict.score,
            "range": [self.min_score, self.max_score],
            "truncated": parts.truncated,
            "reasoning": verdict.reasoning[-_REASONING_CHARS:],
            "cached": False,
        }
        result = RewardResult(reward, status, details)
        if self.cache_size:
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return result

    async def _ask(self, client: openai.AsyncOpenAI, parts: PromptParts) -> Verdict:
        """One attempt: a fresh nonce, the request, a bounded body, a strict verdict."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": build_messages(parts, new_nonce()),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        create = client.chat.completions.with_streaming_response.create
        async with create(**body) as response:
            raw = await read_body(response, self.endpoint.settings.max_response_bytes)
        reply = parse_chat_completion(raw)
        return _parse_verdict(reply.text, self.min_score, self.max_score, reply.finish_reason)


_SHARED: dict[str, LLMJudge] = {}
_SHARED_LOCK = threading.Lock()


def shared_judge(**config: Any) -> LLMJudge:
    """The process's one :class:`LLMJudge` for this configuration (made on first use), so that
    episodes, each with its own environment, share its cache, pool and concurrency bound.
    Unknown keys are refused with a did-you-mean."""
    known = [p for p in inspect.signature(LLMJudge.__init__).parameters if p != "self"]
    for key in config:
        if key not in known:
            raise ConfigError(
                f"judge.{key}: unknown key{did_you_mean(key, known)}; the keys are "
                f"{', '.join([*known, *EnvJudge.KEYS])}"
            )
    if "rubric" not in config or "base_url" not in config or "model" not in config:
        raise ConfigError(
            f"judge: needs rubric, base_url and model (got {', '.join(sorted(config)) or 'none'})"
        )
    key = json.dumps(config, sort_keys=True, default=repr)
    with _SHARED_LOCK:
        judge = _SHARED.get(key)
        if judge is None:
            judge = _SHARED[key] = LLMJudge(**config)
        return judge


class EnvJudge:
    """An environment's reward plus a judge's: ``program_weight * program + weight * judge``.

    What ``MultiTurnEnv(judge=...)`` holds. :meth:`from_config` takes the ``judge`` keyword:
    a mapping of :class:`LLMJudge`'s arguments plus ``weight`` and ``program_weight`` (both
    1.0 by default; ``program_weight: 0`` makes the judge the whole reward), or an
    :class:`LLMJudge`, or an :class:`EnvJudge`.
    """

    KEYS = ("weight", "program_weight")

    def __init__(self, judge: LLMJudge, *, weight: float = 1.0, program_weight: float = 1.0):
        self.judge = judge
        self.weight = _signed("weight", weight)
        self.program_weight = _signed("program_weight", program_weight)

    @classmethod
    def from_config(cls, config: Any) -> EnvJudge:
        if isinstance(config, EnvJudge):
            return config
        if isinstance(config, LLMJudge):
            return cls(config)
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"judge={config!r:.80}: must be a mapping such as {{base_url: ..., model: ..., "
                "rubric: ...}}, or an LLMJudge"
            )
        rest = {str(k): v for k, v in config.items()}
        weights = {k: rest.pop(k) for k in cls.KEYS if k in rest}
        return cls(shared_judge(**rest), **weights)

    def rescore(
        self,
        reward: float,
        details: Mapping[str, Any],
        submission: str,
        *,
        question: str | None = None,
        reference: Any = None,
    ) -> tuple[float, dict[str, Any]]:
        """``(reward, details)`` of the environment's score composed with the judge's verdict
        on ``submission`` (:func:`~areal_agents.rewards.compose.combine`: the environment's
        result under ``components["program"]``, the judge's under its name). Raises
        :class:`JudgeError` when the judge gives no verdict."""
        own = {k: v for k, v in details.items() if k not in ("reward", "status")}
        status = details.get("status")
        if not isinstance(status, str):
            status = "correct" if reward >= 1.0 else "wrong" if reward <= 0.0 else "partial"
        program = RewardResult(float(reward), status, own)
        verdict = self.judge(submission, JudgeContext(question, reference))
        result = combine(
            [("program", program, self.program_weight), (self.judge.name, verdict, self.weight)]
        )
        return result.reward, result.to_details()


def _signed(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"judge.{key}={value!r}: must be a finite number")
    return float(value)
