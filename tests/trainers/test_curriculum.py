"""``algo.task_sampling=learnability`` (``trainers/curriculum.py``): a family whose groups carry
a reward spread is drawn more often than one whose groups all earn the same, none is starved,
the choice is reproducible and survives a checkpoint, and the buffer the loop builds uses it."""

from __future__ import annotations

from collections import Counter

import pytest

from areal_agents.config import load_config
from areal_agents.errors import ConfigError
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.curriculum import WINDOW, EnvFamilies, LearnabilitySampler
from areal_agents.trainers.data import TaskRef, task_seed
from areal_agents.trainers.loop_helpers import buffer_options
from tests.trainers._tiny_learner import row


def parity(seed: int) -> str:
    return "even" if seed % 2 == 0 else "odd"


def taught(sampler: LearnabilitySampler) -> None:
    """Every "even" group so far was solved by all its episodes; every "odd" one was split."""
    for _ in range(WINDOW):
        sampler.record(2, [1.0, 1.0, 1.0, 1.0])
        sampler.record(3, [0.0, 1.0, 0.0, 1.0])


def test_rating_is_laplaces_rule_over_the_last_window_of_groups() -> None:
    sampler = LearnabilitySampler(parity)
    assert sampler.rating("never seen") == 0.5
    taught(sampler)
    assert sampler.rating("even") == pytest.approx(1 / (WINDOW + 2))
    assert sampler.rating("odd") == pytest.approx((WINDOW + 1) / (WINDOW + 2))
    for _ in range(WINDOW):  # the policy moved: the even tasks now split their groups
        sampler.record(4, [0.0, 1.0])
    assert sampler.rating("even") == sampler.rating("odd")
    sampler.record(5, [])  # a dropped group says nothing
    assert sampler.rating("odd") == pytest.approx((WINDOW + 1) / (WINDOW + 2))


def test_families_with_a_spread_are_drawn_more_and_none_is_starved() -> None:
    uniform, learn = LearnabilitySampler(parity), LearnabilitySampler(parity)
    taught(learn)
    n = 400
    drawn = Counter(parity(learn.choose(TaskRef(i, task_seed(0, i))).seed) for i in range(n))
    plain = Counter(parity(uniform.choose(TaskRef(i, task_seed(0, i))).seed) for i in range(n))
    assert 0.35 < plain["odd"] / n < 0.65  # unrated families: as the candidates come
    # ratings 0.9 and 0.1 over 8 candidates, of which ~half odd: ~0.88 of the draws (~0.5 plain)
    assert drawn["odd"] / n > 0.8
    assert drawn["even"] > 0  # never never
    assert learn.chosen == dict(drawn)


def test_the_choice_is_reproducible_and_survives_a_checkpoint() -> None:
    a, b = LearnabilitySampler(parity, data_seed=3), LearnabilitySampler(parity, data_seed=3)
    taught(a)
    b.load_state_dict(a.state_dict())
    refs = [TaskRef(i, task_seed(3, i)) for i in range(50)]
    assert [a.choose(r) for r in refs] == [b.choose(r) for r in refs]
    assert all(a.choose(r).index == r.index for r in refs)
    other = LearnabilitySampler(parity, data_seed=4)
    taught(other)
    assert [other.choose(r) for r in refs] != [a.choose(r) for r in refs]


def buffer(*overrides: str, env: str = "code_sandbox") -> TrajectoryBuffer:
    cfg = load_config(TrainConfig, [f"env={env}", "trainer.groups_per_step=2", *overrides])
    return TrajectoryBuffer(**buffer_options(cfg))


def test_task_sampling_changes_the_tasks_the_buffer_admits_and_resumes_them() -> None:
    plain = buffer("trainer.max_staleness=8")
    learn = buffer("trainer.max_staleness=8", "algo.task_sampling=learnability")
    assert learn.sampler is not None and plain.sampler is None
    first = learn.admit(4)
    assert [r.index for r, _ in first] == [0, 1, 2, 3]
    assert [r.seed for r, _ in first] != [r.seed for r, _ in plain.admit(4)]
    families = EnvFamilies("code_sandbox")
    for ref, _ in first:  # every group of these tasks' families was solved by all its episodes
        assert learn.complete(ref.index, [row("a", 1.0), row("b", 1.0)]) == "ready"
    mastered = {families(ref.seed) for ref, _ in first}
    assert all(learn.sampler.rating(f) == pytest.approx(1 / 3) for f in mastered)
    assert learn.stats()["tasks/families_seen"] == len(mastered)
    state = learn.state_dict()
    resumed = buffer("trainer.max_staleness=8", "algo.task_sampling=learnability")
    resumed.load_state_dict(state)
    assert resumed.sampler is not None and resumed.sampler.spreads == learn.sampler.spreads
    assert resumed.admit(6) == learn.admit(6)


def test_task_sampling_is_checked_and_needs_tasks_named_before_a_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="task_sampling"):
        load_config(TrainConfig, ["algo.task_sampling=hardest"])
    families = EnvFamilies("calculator")
    assert families(7) == families(7) and families(7) != families(8)  # its own family each
    families.close()

    class Unnamed:  # an environment that draws its task only in reset (a remote one)
        unwrapped = object()

        def close(self) -> None:
            pass

    import areal_agents.envs.registry as registry

    monkeypatch.setattr(registry, "make_env", lambda name, **kwargs: Unnamed())
    cfg = load_config(TrainConfig, ["env=calculator", "algo.task_sampling=learnability"])
    with pytest.raises(ConfigError, match="sample_task"):
        buffer_options(cfg)


def test_a_held_out_seed_is_rated_under_the_task_the_workers_play_instead() -> None:
    from areal_agents.envs.registry import make_env
    from areal_agents.trainers.data import avoid_tasks, task_family, task_id_of

    env = make_env("code_sandbox")
    seeds = [task_seed(0, i) for i in range(64)]
    held = frozenset(task_id_of(env, s) for s in seeds[:32])
    played = [avoid_tasks(env, s, held) for s in seeds[:32]]
    moved = [(s, p) for s, p in zip(seeds[:32], played, strict=True) if p != s]
    # a seed whose replacement is of another template, so the two ratings differ
    seed, stand_in = next(
        (s, p)
        for s, p in moved
        if task_family(task_id_of(env, s)) != task_family(task_id_of(env, p))
    )
    env.close()
    plain, guarded = EnvFamilies("code_sandbox"), EnvFamilies("code_sandbox", excluded=held)
    assert guarded(seed) == plain(stand_in) != plain(seed)
    assert guarded(seeds[40]) == plain(seeds[40])  # a seed nobody holds out is its own task
    cfg = load_config(TrainConfig, ["env=code_sandbox", "algo.task_sampling=learnability"])
    families = buffer_options(cfg, held)["task_families"]
    assert families is not None and families.excluded == held
    for f in (plain, guarded, families):
        f.close()
