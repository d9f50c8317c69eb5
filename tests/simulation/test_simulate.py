"""The simulator's accounting on cases worked out by hand, its bounds, and its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError
from areal_agents.simulate import main
from areal_agents.simulation import (
    EpisodeProfile,
    LearnerProfile,
    Profile,
    ServerProfile,
    SimConfig,
    available_profiles,
    load_profile,
    profile_from_rows,
    profile_from_run,
    simulate,
)

# A machine simple enough to simulate on paper: each server makes 10 tokens/s whatever its load
# (shared equally among its requests); every episode is one turn of 100 tokens; a step trains
# in 4 s + 0.01 s per token (6 s for a batch of 2 x 100 tokens); a push takes 1 s and pauses
# the servers.
FLAT = Profile(
    name="paper",
    server=ServerProfile(concurrency=(1,), throughput=(10.0,)),
    episode=EpisodeProfile(turns={1: 1.0}, tokens_per_turn={100.0: 1.0}),
    learner=LearnerProfile(step_s=4.0, token_s=0.01),
    push_s=1.0,
)
# the push holds the learner too: each step ends when its push does (overlap_push is below)
TWO_SERVERS = SimConfig(servers=2, groups_per_step=1, group_size=2, steps=3, overlap_push=False)


def test_sync_is_generation_then_training_then_push_each_step() -> None:
    # One group of 2 episodes per step, one on each server, each alone: 100 / 10 = 10 s.
    # Then train 6 s, push 1 s: a step is 17 s, three steps 51 s, 3 x 200 tokens trained.
    # Servers: busy 10 s generating + 1 s loading weights per step, idle 6 s (of 17).
    # Learner: trains 6 s of every 17.
    r = simulate(FLAT, SimConfig(**{**TWO_SERVERS.__dict__, "mode": "sync"}))
    assert r.step_ends == pytest.approx([17.0, 34.0, 51.0])
    assert r.elapsed_s == pytest.approx(51.0)
    assert (r.trained_samples, r.trained_tokens) == (6, 600)
    assert r.tokens_per_s == pytest.approx(600 / 51)
    assert r.generation_idle_frac == pytest.approx(6 / 17)
    assert r.learner_idle_frac == pytest.approx(11 / 17)
    assert (r.staleness_mean, r.staleness_max) == (0.0, 0)


def test_async_overlaps_generation_with_training_within_the_bound() -> None:
    # Staleness 1, one group per step: the buffer admits 2 groups at once (4 episodes, 2 per
    # server, 5 tok/s each): both groups finish at 20 s.
    #   20-26 train group 0 (servers idle: the buffer is full), 26-27 push -> version 1.
    #   27: group 2 admitted (alone on each server, 10 tok/s); 27-33 train group 1 (admitted
    #       under version 0, trained at step 1: staleness 1); 33-34 push, servers paused.
    #       Group 2 made 60 of its 100 tokens by 33.
    #   34: version 2; group 3 admitted and shares the servers: group 2's last 40 tokens at
    #       5 tok/s end at 42.  42-48 train group 2 (started under version 1, step 2:
    #       staleness 1), 48-49 push.  3 steps in 49 s (sync: 51).
    # Servers idle only 20-26 (6 s of 49); the learner trains 18 s of 49.
    r = simulate(FLAT, SimConfig(**{**TWO_SERVERS.__dict__, "mode": "async", "max_staleness": 1}))
    assert r.step_ends == pytest.approx([27.0, 34.0, 49.0])
    assert r.trained_tokens == 600
    assert r.generation_idle_frac == pytest.approx(6 / 49)
    assert r.learner_idle_frac == pytest.approx(31 / 49)
    assert r.staleness_mean == pytest.approx(2 / 3)
    assert r.staleness_max == 1
    # group 3, alone again from 42, makes its last 60 tokens by 48: generated but never trained
    # (the run ends after step 3), so 4 groups x 200 tokens were generated
    assert r.generated_tokens == 800


def test_two_learners_halve_the_training_time_at_full_efficiency() -> None:
    prof = Profile(
        name="paper2",
        server=FLAT.server,
        episode=FLAT.episode,
        learner=LearnerProfile(step_s=4.0, token_s=0.01, scaling_efficiency=1.0),
        push_s=1.0,
    )
    # 10 s generation + 3 s training + 1 s push per step
    r = simulate(prof, SimConfig(**{**TWO_SERVERS.__dict__, "mode": "sync", "learners": 2}))
    assert r.elapsed_s == pytest.approx(3 * 14.0)


@pytest.mark.parametrize("eta", [0, 1, 3, 6])
@pytest.mark.parametrize("order", ["ready", "admission"])
def test_staleness_never_exceeds_the_bound(eta: int, order: str) -> None:
    prof = load_profile("cpu_2core_builtin")  # a long tail of turns: 2 to 13
    cfg = SimConfig(
        mode="async" if eta else "sync",
        max_staleness=eta,
        servers=3,
        groups_per_step=4,
        group_size=3,
        steps=12,
        batch_order=order,  # type: ignore[arg-type]
    )
    r = simulate(prof, cfg)
    assert r.steps == 12 and r.trained_samples == 12 * 4 * 3
    assert r.staleness_max <= eta
    assert 0.0 <= r.generation_idle_frac <= 1.0 and 0.0 <= r.learner_idle_frac <= 1.0
    # the learner's busy time is exactly the training time
    assert (1.0 - r.learner_idle_frac) * r.elapsed_s == pytest.approx(r.train_s)


def test_server_throughput_is_interpolated_between_measured_points() -> None:
    s = ServerProfile(concurrency=(2, 4, 8), throughput=(20.0, 30.0, 50.0))
    assert s.tokens_per_s(0) == 0.0
    assert s.tokens_per_s(1) == pytest.approx(10.0)  # proportional below the first point
    assert s.tokens_per_s(3) == pytest.approx(25.0)
    assert s.tokens_per_s(6) == pytest.approx(40.0)
    assert s.tokens_per_s(100) == pytest.approx(50.0)  # flat above the last


def test_shipped_profiles_load_and_unknown_ones_fail_with_the_list() -> None:
    assert {"cpu_2core_builtin", "gpu_h100_vllm_8b"} <= set(available_profiles())
    for name in available_profiles():
        p = load_profile(name)
        assert p.sources, f"{name} must say where its numbers come from"
    with pytest.raises(ConfigError, match="cpu_2core_builtin"):
        load_profile("no_such_profile")


def test_command_line_prints_sync_and_async_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "cpu_2core_builtin", "--steps", "2", "--staleness", "1,2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["sync", "async", "async"]
    assert rows[0][3] == "1.00x"
    assert all(float(r[1 if r[0] == "sync" else 2]) > 0 for r in rows)  # tokens/s


def test_a_profile_from_a_runs_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # three steps: training takes 10 s + 0.01 s per token; pushes 1, 2, 3 s;
    # 4 episodes of 3 turns each step: 600 tokens / 36 turns
    rows = [
        {
            "time/train_s": 10 + 0.01 * tokens,
            "time/sync_s": push,
            "tokens/policy": tokens,
            "episodes": 4,
            "episode/turns_mean": 3.0,
        }
        for tokens, push in ((100, 1.0), (200, 2.0), (300, 3.0))
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = load_profile("cpu_2core_builtin")
    p = profile_from_run(tmp_path, base)
    assert p.learner.step_s == pytest.approx(10.0)
    assert p.learner.token_s == pytest.approx(0.01)
    assert p.push_s == pytest.approx(2.0)
    assert p.episode.mean_tokens_per_turn == pytest.approx(600 / 36)
    assert p.server == base.server and p.episode.turns == base.episode.turns
    assert main(["--from-run", str(tmp_path), "--steps", "1", "--staleness", "1"]) == 0
    assert f"+{tmp_path.name}" in capsys.readouterr().out
    # an overlapped run also records each push start to served (time/push_s, 0 before the
    # first one is served); the push held the loop only for time/sync_s
    for r, whole in zip(rows, (0.0, 4.0, 6.0), strict=True):
        r["time/push_s"], r["time/sync_s"] = whole, r["time/sync_s"] / 4
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = profile_from_run(tmp_path, base)
    assert (p.push_s, p.push_learner_s) == pytest.approx((5.0, 0.5))
    # the same rows held in memory (a results file's per-step figures) give the same profile
    q = profile_from_rows(rows, base, "results.json", tmp_path.name)
    assert (q.learner, q.push_s, q.push_learner_s, q.episode) == (
        p.learner,
        p.push_s,
        p.push_learner_s,
        p.episode,
    )
    assert q.name == p.name and q.sources["learner"].startswith("results.json:")
    with pytest.raises(ConfigError, match=r"results.json: step row 1 lacks tokens/policy"):
        no_tokens = {k: v for k, v in rows[1].items() if k != "tokens/policy"}
        profile_from_rows([rows[0], no_tokens], base, "results.json", "x")
    # a run's file is checked by the same rule, and named
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(no_tokens))
    with pytest.raises(ConfigError, match=r"metrics.jsonl: step row 1 lacks tokens/policy"):
        profile_from_run(tmp_path, base)


def test_sync_may_run_on_a_profile_of_its_own_placement() -> None:
    from areal_agents.simulate import run_table

    twice = Profile(
        name="paper-all-cores",  # sync's placement: the server twice as fast, in turn
        server=ServerProfile(concurrency=(1,), throughput=(20.0,)),
        episode=FLAT.episode,
        learner=FLAT.learner,
        push_s=1.0,
    )
    base = SimConfig(**{**TWO_SERVERS.__dict__, "mode": "sync"})
    rows = run_table(FLAT, base, [1], sync_profile=twice)
    # sync, as in the first test but generating in 5 s: 12 s a step; async as before, on FLAT
    assert rows[0]["elapsed_s"] == pytest.approx(36.0)
    assert rows[1]["elapsed_s"] == pytest.approx(49.0)
    assert rows[1]["vs_sync"] == pytest.approx(36.0 / 49.0, abs=1e-3)


# The push overlapping the next step, on paper: one server making 100 tokens/s whatever its
# load, episodes of one 100-token turn, one episode per group and per step; a step trains in
# 4 s; a push holds the learner 0.5 s (its snapshot) and the servers 2 s.
FAST = Profile(
    name="paper-overlap",
    server=ServerProfile(concurrency=(1,), throughput=(100.0,)),
    episode=EpisodeProfile(turns={1: 1.0}, tokens_per_turn={100.0: 1.0}),
    learner=LearnerProfile(step_s=4.0, token_s=0.0),
    push_s=2.0,
    push_learner_s=0.5,
)
ONE = SimConfig(mode="async", max_staleness=2, groups_per_step=1, group_size=1, steps=3)


def test_an_overlapped_push_frees_the_learner_after_its_snapshot() -> None:
    # Staleness 2 admits 3 groups at 0: they share the server and finish at 3 s.
    #   3-7 train group 0; 7 snapshot, the servers load version 1 until 9; the step ends at 7.5
    #   7.5-11.5 train group 1 (9: version 1 served, group 3 admitted, done at 10)
    #   11.5 push (servers to 13.5), step ends at 12; 12-16 train group 2, step ends at 16.5.
    r = simulate(FAST, ONE)
    assert r.step_ends == pytest.approx([7.5, 12.0, 16.5])
    assert (r.staleness_mean, r.staleness_max) == (1.0, 2)
    # without the overlap each step waits for its push: 3-7 train, 7-9 push, and so on
    serial = simulate(FAST, SimConfig(**{**ONE.__dict__, "overlap_push": False}))
    assert serial.step_ends == pytest.approx([9.0, 15.0, 21.0])
    assert (serial.staleness_mean, serial.staleness_max) == (1.0, 2)


def test_a_push_longer_than_a_step_holds_the_next_push_not_the_training() -> None:
    # Pushes of 5 s that hold only the servers: 3-7 train, push 7-12 while 7-11 trains group 1;
    # its push waits for the first one (12-17) while 12-16 trains group 2, whose push starts at
    # 17: the step ends 7, 12, 17. Serially: 3-7, 7-12, 12-16, 16-21, 21-25, 25-30.
    slow = Profile(
        name="paper-slow-push",
        server=FAST.server,
        episode=FAST.episode,
        learner=FAST.learner,
        push_s=5.0,
    )
    assert simulate(slow, ONE).step_ends == pytest.approx([7.0, 12.0, 17.0])
    serial = simulate(slow, SimConfig(**{**ONE.__dict__, "overlap_push": False}))
    assert serial.step_ends == pytest.approx([12.0, 21.0, 30.0])
