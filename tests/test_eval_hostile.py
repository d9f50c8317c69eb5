"""``eval`` against a hostile endpoint: every misbehaviour ends in a bounded, counted outcome.

Each mode of ``tests/policies/hostile_openai.py`` is driven through the eval command (its
``main``, in this process; a few through the real command line) and the test asserts what the
run must make of it: it ends within a deadline, ``summary.json`` exists with the right counts,
and the exit status is the documented one — 1 when no episode finished.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from areal_agents.eval import main
from tests.policies.hostile_openai import (
    BAD_TOOL_CALLS,
    BROKEN,
    DEEP_IN_TEXT,
    MALFORMED,
    HostileOpenAI,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
EPISODES = 2
RETRIES = 1
DEADLINE_S = 60.0  # generous: the slowest mode needs ~2 s (2 attempts x 1 s + backoff)


def _args(base_url: str, out: Path, *extra: str) -> list[str]:
    return [
        "env=calculator",
        f"policy.base_url={base_url}",
        "policy.model=x",
        "policy.api_key=none",
        f"num_episodes={EPISODES}",
        f"concurrency={EPISODES}",
        f"policy.max_retries={RETRIES}",
        "policy.timeout_s=1",
        "policy.backoff_s=0.05",
        "policy.max_response_mb=1",
        f"output_dir={out}",
        "progress=false",
        *extra,
    ]


def _eval(mode: str, out: Path) -> tuple[int, dict[str, Any], HostileOpenAI, float]:
    """Run eval against ``mode``: (exit status, summary.json, the server, seconds)."""
    server = HostileOpenAI(mode)
    start = time.monotonic()
    with server.running():
        try:
            main(_args(server.base_url, out))
            status = 0
        except SystemExit as e:
            status = int(e.code or 0)
    elapsed = time.monotonic() - start
    summary = json.loads((out / "summary.json").read_text())
    return status, summary, server, elapsed


@pytest.mark.parametrize("mode", sorted(MALFORMED))
def test_a_malformed_reply_drops_the_episode_and_is_counted(mode: str, tmp_path: Path) -> None:
    status, summary, server, elapsed = _eval(mode, tmp_path)
    assert elapsed < DEADLINE_S
    assert status == 1  # no episode finished
    assert summary["episodes"] == 0 and summary["episodes_failed"] == 0
    assert summary["episodes_dropped"] == EPISODES
    assert summary["dropped_by_kind"] == {"MalformedResponseError": EPISODES}
    attempts = EPISODES * (RETRIES + 1)  # bounded retries, then dropped
    assert summary["endpoint"]["malformed"] == attempts == server.requests
    assert summary["endpoint"]["attempts"] == attempts
    assert all("MalformedResponseError" in d["error"] for d in summary["dropped"])


@pytest.mark.parametrize("mode", sorted(BROKEN))
def test_a_broken_endpoint_drops_the_episode_within_the_deadline(mode: str, tmp_path: Path) -> None:
    status, summary, server, elapsed = _eval(mode, tmp_path)
    assert elapsed < DEADLINE_S  # a trickling body or a silent server cannot hold the run
    assert status == 1
    assert summary["episodes"] == 0 and summary["episodes_dropped"] == EPISODES
    assert summary["dropped_by_kind"] == {"EndpointError": EPISODES}
    retried = BROKEN[mode][1]
    attempts = EPISODES * (RETRIES + 1 if retried else 1)
    assert summary["endpoint"]["attempts"] == attempts == server.requests
    if mode in ("trickle", "hang", "slow"):
        assert summary["endpoint"]["timeout"] == attempts
    if BROKEN[mode][0] is not None:
        assert summary["endpoint"][f"http_{BROKEN[mode][0]}"] == attempts


@pytest.mark.parametrize("mode", sorted(BAD_TOOL_CALLS))
def test_a_malformed_tool_call_is_counted_and_does_not_end_the_episode(
    mode: str, tmp_path: Path
) -> None:
    status, summary, _, elapsed = _eval(mode, tmp_path)
    assert elapsed < DEADLINE_S
    assert status == 0
    # The malformed call was not taken as an answer: the episode went on, and the correct
    # answer of the second turn won it.
    assert summary["episodes"] == EPISODES and summary["mean_reward"] == 1.0
    assert summary["turns_per_episode"] == 2
    assert summary["malformed_tool_calls"] == EPISODES
    assert summary["endpoint"]["malformed_tool_calls"] == EPISODES
    assert sum(summary["tool_errors"].values()) == EPISODES  # the environment's error count
    records = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").open()]
    assert [r["malformed_tool_calls"] for r in records] == [1] * EPISODES


@pytest.mark.parametrize("mode", sorted(DEEP_IN_TEXT))
def test_deep_nesting_in_a_tool_call_leaves_every_episode_accounted_for(
    mode: str, tmp_path: Path
) -> None:
    status, summary, _, elapsed = _eval(mode, tmp_path)
    assert elapsed < DEADLINE_S
    done = summary["episodes"] + summary["episodes_dropped"] + summary["episodes_failed"]
    assert done == EPISODES
    assert status == (1 if summary["episodes_failed"] or not summary["episodes"] else 0)
    for failure in summary["failed"]:  # an environment that raises is recorded, not a crash
        assert failure["kind"] and "Traceback" in failure["traceback"]


def test_good_and_flaky_endpoints_finish_every_episode(tmp_path: Path) -> None:
    status, summary, _, _ = _eval("good", tmp_path / "good")
    assert status == 0 and summary["episodes"] == EPISODES and summary["mean_reward"] == 1.0
    assert summary["endpoint"] == {"attempts": EPISODES, "malformed_tool_calls": 0}
    # Every first reply is garbage: one retry each, and every episode still finishes.
    status, summary, server, _ = _eval("flaky", tmp_path / "flaky")
    assert status == 0 and summary["episodes"] == EPISODES and summary["mean_reward"] == 1.0
    assert summary["endpoint"]["malformed"] == EPISODES == server.requests // 2
    assert summary["endpoint"]["retries"] == EPISODES


def test_a_dead_endpoint_exits_non_zero_with_a_summary(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as exit_info:
        main(_args(f"http://127.0.0.1:{port}/v1", tmp_path))
    assert exit_info.value.code == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 0 and summary["episodes_dropped"] == EPISODES
    assert summary["endpoint"]["connection"] == EPISODES * (RETRIES + 1)


@pytest.mark.parametrize(
    ("mode", "code"), [("invalid_json", 1), ("trickle", 1), ("tool_name_null", 0)]
)
def test_the_command_line_against_a_hostile_endpoint(mode: str, code: int, tmp_path: Path) -> None:
    """The real command: the documented exit status, a summary, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with HostileOpenAI(mode).running() as server:
        proc = subprocess.run(
            [sys.executable, "-m", "areal_agents.eval", *_args(server.base_url, tmp_path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == (EPISODES if code == 0 else 0)
    if code:
        assert f"error: 0 of {EPISODES} episodes finished ({EPISODES} dropped" in proc.stderr
