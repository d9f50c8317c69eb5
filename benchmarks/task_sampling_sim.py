"""How much ``algo.task_sampling=learnability`` can raise the share of groups that train, by
simulation over the task families' success rates that real runs measured.

GRPO trains only on a group whose rewards differ. Each family's per-episode success rate is
read from the given runs' ``metrics.jsonl`` (``batch/task_ids``, ``batch/group_rewards``); a
simulated run then draws ``--groups`` groups of ``--group-size`` Bernoulli episodes, each task
chosen among ``CANDIDATES`` uniformly drawn families by a rating rule, with the last
``--in-flight`` groups not yet rated (as in an async run), and counts the groups with a spread.
The rules: uniform (the first candidate), the project's
:class:`~areal_agents.trainers.curriculum.LearnabilitySampler` rating, and ratings from the
episodes' success rate (``1 - p^n - (1 - p)^n`` with ``p`` estimated under a Beta(a, a) prior).

    python -m benchmarks.task_sampling_sim runs/rl_gain_norm/code_sandbox-seed2/select_default
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from pathlib import Path

from areal_agents.files import read_jsonl
from areal_agents.trainers.curriculum import CANDIDATES, WINDOW, LearnabilitySampler
from areal_agents.trainers.data import task_family

__all__ = ["family_rates", "main", "simulate"]

Rule = Callable[[Sequence[Sequence[float]]], float]


def family_rates(runs: Sequence[Path]) -> dict[str, float]:
    """Each family's share of episodes with reward 1 over the runs' training batches."""
    won: dict[str, float] = defaultdict(float)
    played: dict[str, int] = defaultdict(int)
    for run in runs:
        for record in read_jsonl(run / "metrics.jsonl", torn_ok=True):
            for task_id, rewards in zip(
                record.get("batch/task_ids") or [],
                record.get("batch/group_rewards") or [],
                strict=True,
            ):
                family = task_family(str(task_id)) or str(task_id)
                won[family] += sum(float(r) >= 1.0 for r in rewards)
                played[family] += len(rewards)
    return {f: won[f] / played[f] for f in sorted(played) if played[f]}


def _laplace(history: Sequence[Sequence[float]]) -> float:
    sampler = LearnabilitySampler(lambda seed: "f")
    for rewards in history:
        sampler.record(0, rewards)
    return sampler.rating("f")


def _episodes(a: float, n: int) -> Rule:
    def rule(history: Sequence[Sequence[float]]) -> float:
        won = sum(sum(g) for g in history)
        played = sum(len(g) for g in history)
        p = (won + a) / (played + 2 * a)
        return 1 - p**n - (1 - p) ** n

    return rule


def simulate(
    rates: dict[str, float],
    rule: Rule | None,
    *,
    groups: int = 96,
    group_size: int = 4,
    in_flight: int = 12,
    trials: int = 300,
) -> float:
    """The mean share of a simulated run's groups whose rewards differ (``rule`` None:
    uniform)."""
    families = list(rates)
    total = 0.0
    for trial in range(trials):
        rng = random.Random(trial)
        history: dict[str, deque[list[float]]] = defaultdict(lambda: deque(maxlen=WINDOW))
        pending: deque[tuple[int, str, list[float]]] = deque()
        spread = 0
        for i in range(groups):
            while pending and pending[0][0] <= i - in_flight:
                _, done, rewards = pending.popleft()
                history[done].append(rewards)
            candidates = [rng.choice(families) for _ in range(CANDIDATES)]
            if rule is None:
                family = candidates[0]
            else:
                family = rng.choices(candidates, [rule(history[c]) for c in candidates])[0]
            rewards = [float(rng.random() < rates[family]) for _ in range(group_size)]
            spread += len(set(rewards)) > 1
            pending.append((i, family, rewards))
        total += spread / groups
    return total / trials


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories to read rates from")
    parser.add_argument("--groups", type=int, default=96)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=12)
    parser.add_argument("--trials", type=int, default=300)
    args = parser.parse_args(argv)
    rates = family_rates(args.runs)
    print(" ".join(f"{f.split('/')[-1]}={p:.2f}" for f, p in rates.items()))
    rules: dict[str, Rule | None] = {
        "uniform": None,
        "learnability (the sampler)": _laplace,
        **{f"episodes, Beta({a}, {a})": _episodes(a, args.group_size) for a in (1, 0.5, 0.25)},
    }
    for name, rule in rules.items():
        share = simulate(
            rates,
            rule,
            groups=args.groups,
            group_size=args.group_size,
            in_flight=args.in_flight,
            trials=args.trials,
        )
        print(f"{name:28} groups with a spread: {share:.3f}")


if __name__ == "__main__":
    main()
