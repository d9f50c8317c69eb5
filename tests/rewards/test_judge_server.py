"""``rewards.judge`` against the built-in server on the tiny random model: the whole wire path.

Real HTTP on 127.0.0.1, the real client (``EndpointClient``: deadline, retries, the bounded
body read, the total reply parser) and the real server (``serving/api.py`` over the engine's
continuous batching), in this process so that it starts in seconds. A random model never
writes a ``SCORE:`` line: every request is a reply without a verdict, retried, then a
:class:`JudgeError` — the dropped, counted episode, never a 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import gymnasium as gym
import pytest

import areal_agents.envs  # noqa: F401  (registers the built-in ids)
from areal_agents.errors import ConfigError
from areal_agents.net import free_port
from areal_agents.rewards.judge import JudgeError, LLMJudge

RUBRIC = "10 if the answer is a prime number, else 0."


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    import uvicorn

    from areal_agents.serving.api import create_app
    from areal_agents.serving.engine import Engine
    from areal_agents.trainers.modeling import tiny_model_path

    engine = Engine(tiny_model_path(), max_batch_size=4)
    port = free_port()
    app = create_app(engine, "tiny", api_key="judge-key")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=30)
    engine.close()


def tiny_judge(base_url: str, **kwargs: object) -> LLMJudge:
    settings = {"api_key": "judge-key", "max_tokens": 4, "backoff_s": 0.0, "cache_size": 0}
    settings.update(kwargs)
    return LLMJudge(RUBRIC, base_url=base_url, model="tiny", **settings)  # type: ignore[arg-type]


def test_a_random_model_gives_no_verdict_retried_then_judge_error(base_url: str) -> None:
    judge = tiny_judge(base_url, max_retries=1)
    with pytest.raises(JudgeError, match="after 2 attempts") as caught:
        judge("7", None)
    assert "MalformedResponseError" in str(caught.value)  # the replies came, without a verdict
    stats = judge.stats
    assert stats["attempts"] == 2 and stats["retries"] == 1
    assert stats["malformed"] == 2 and stats["failed"] == 1 and stats["judged"] == 0


def test_a_batch_is_judged_concurrently_by_the_server(base_url: str) -> None:
    judge = tiny_judge(base_url, max_retries=0, max_concurrency=3)
    out = judge.score_batch([(str(n), None) for n in range(3)], return_exceptions=True)
    assert all(isinstance(r, JudgeError) for r in out) and judge.stats["attempts"] == 3


def test_the_deadline_cuts_a_long_reply_off(base_url: str) -> None:
    judge = tiny_judge(base_url, max_tokens=1500, timeout_s=0.05, max_retries=1)
    with pytest.raises(JudgeError, match="no complete reply within"):
        judge("7", None)
    assert judge.stats["timeout"] == 2


def test_the_key_is_sent_and_a_wrong_one_is_a_configuration_error(base_url: str) -> None:
    with pytest.raises(ConfigError, match="refused the API key"):
        tiny_judge(base_url, api_key="wrong")("7", None)


def test_an_environment_with_this_judge_drops_the_episode(base_url: str) -> None:
    config = {"base_url": base_url, "model": "tiny", "rubric": RUBRIC, "api_key": "judge-key"}
    env = gym.make(
        "areal_agents/Calculator-v0", judge={**config, "max_tokens": 16, "backoff_s": 0.0}
    )
    env.reset(seed=0)
    with pytest.raises(JudgeError):
        env.step("\\boxed{7}")
    env.close()
