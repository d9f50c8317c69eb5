"""Intervals for success rates and for paired before/after comparisons on the same tasks.

A learning result here is a held-out success rate measured twice on the same tasks: before and
after a phase of training. Its change is judged *paired*, task by task: a task solved before
and after (or failed both times) says nothing about the change; only the discordant tasks do.

* :func:`wilson_interval` — the interval of one success rate ``k / n``.
* :func:`mcnemar_p` — McNemar's exact test: the two-sided binomial p-value of ``b`` tasks
  fixed against ``c`` broken (under "no change" each discordant task is a fair coin).
* :func:`paired_bootstrap` — a percentile bootstrap interval of the mean paired difference,
  resampling tasks (so the pairing is kept), or whole families of tasks (``clusters``: the
  instances of one template move together, so they are one unit of evidence, not several).
* :func:`compare_paired` — all of it for two ``{task: solved}`` maps, as a
  :class:`PairedComparison` (the record ``summary.json`` and the benchmarks store).

Pure Python and NumPy: no torch, usable from the command lines, the reports and benchmarks.

>>> round(mcnemar_p(10, 2), 4)
0.0386
>>> lo, hi = wilson_interval(47, 64)
>>> round(lo, 3), round(hi, 3)
(0.615, 0.827)
>>> c = compare_paired({i: i < 40 for i in range(64)}, {i: i < 48 for i in range(64)})
>>> c.n, c.improved, c.regressed, round(c.gain_points, 1)
(64, 8, 0, 12.5)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "MIN_FAMILIES",
    "PairedComparison",
    "compare_paired",
    "mcnemar_p",
    "paired_bootstrap",
    "wilson_interval",
]


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a success rate ``k / n`` (95% for the default ``z``);
    ``(0.0, 1.0)`` when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k={k} successes out of n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_p(improved: int, regressed: int) -> float:
    """McNemar's exact two-sided p-value for ``improved`` tasks fixed and ``regressed`` broken:
    ``2 * P(X <= min(b, c))`` for ``X ~ Binomial(b + c, 1/2)``, at most 1 (1 with no
    discordant task)."""
    if improved < 0 or regressed < 0:
        raise ValueError(f"counts must be >= 0, got {improved} and {regressed}")
    n = improved + regressed
    if n == 0:
        return 1.0
    k = min(improved, regressed)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(
    before: Sequence[float],
    after: Sequence[float],
    *,
    clusters: Sequence[Hashable] | None = None,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(after - before)``, resampling the pairs (tasks)
    with replacement ``resamples`` times (seeded: the same data gives the same interval).

    ``clusters``: each pair's family (one label per pair). Whole families are resampled
    instead of single tasks, and each draw's statistic is the mean over the tasks it holds
    (the cluster bootstrap): where a family's tasks are solved or failed together, its tasks
    are not independent and the task-level interval is too narrow."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} values before, {len(after)} after: pair them by task")
    if not before:
        raise ValueError("no pairs to compare")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must be in (0, 1)")
    diff = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)  # [n]
    rng = np.random.default_rng(seed)
    if clusters is None:
        idx = rng.integers(0, len(diff), size=(resamples, len(diff)))  # [R, n]
        means = diff[idx].mean(axis=1)  # [R]
    else:
        if len(clusters) != len(diff):
            raise ValueError(f"{len(clusters)} cluster labels for {len(diff)} pairs")
        ids = {c: i for i, c in enumerate(dict.fromkeys(clusters))}
        label = np.fromiter((ids[c] for c in clusters), dtype=np.int64, count=len(diff))
        sums = np.bincount(label, weights=diff, minlength=len(ids))  # [K]
        sizes = np.bincount(label, minlength=len(ids)).astype(float)  # [K]
        idx = rng.integers(0, len(ids), size=(resamples, len(ids)))  # [R, K]
        means = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)  # [R]
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class PairedComparison:
    """Success on the same tasks before and after, with the change's interval and test."""

    n: int
    """Tasks measured both times (the pairs)."""
    before: float
    """Success rate before (share of the ``n`` tasks)."""
    after: float
    """Success rate after."""
    improved: int
    """Tasks failed before and solved after."""
    regressed: int
    """Tasks solved before and failed after."""
    gain_points: float
    """``100 * (after - before)``."""
    ci95_points: tuple[float, float]
    """Paired bootstrap 95% interval of the gain, in points."""
    mcnemar_p: float
    """McNemar's exact two-sided p-value (``improved`` vs ``regressed``)."""
    families: int | None = None
    """How many families (templates) the ``n`` tasks fall into; None when not known or when
    every task is its own family."""
    family_ci95_points: tuple[float, float] | None = None
    """The cluster bootstrap's 95% interval of the gain, resampling whole families (wider than
    ``ci95_points`` where a family's tasks move together); None without ``families``."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PairedComparison:
        """The inverse of :meth:`to_json` (a record written before the family fields is read
        with them None)."""
        out = dict(data)
        out["ci95_points"] = tuple(out["ci95_points"])
        if out.get("family_ci95_points") is not None:
            out["family_ci95_points"] = tuple(out["family_ci95_points"])
        return cls(**out)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (rates rounded to 4 places, points to 1)."""
        out = asdict(self)
        out["before"], out["after"] = round(self.before, 4), round(self.after, 4)
        out["gain_points"] = round(self.gain_points, 1)
        out["ci95_points"] = [round(v, 1) for v in self.ci95_points]
        if self.family_ci95_points is not None:
            out["family_ci95_points"] = [round(v, 1) for v in self.family_ci95_points]
        out["mcnemar_p"] = round(self.mcnemar_p, 4)
        return out

    def describe(self) -> str:
        """One line: ``+12.5 points (95% CI +4.7 to +20.3; 8 fixed, 0 broken; McNemar
        p=0.008)``, and where the tasks come in families, ``; by family (12): -1.6 to +25.0``
        before the closing parenthesis."""
        lo, hi = self.ci95_points
        family = ""
        if self.family_ci95_points is not None:
            flo, fhi = self.family_ci95_points
            family = f"; 95% CI by family ({self.families}) {flo:+.1f} to {fhi:+.1f}"
        return (
            f"{self.gain_points:+.1f} points (95% CI {lo:+.1f} to {hi:+.1f}; "
            f"{self.improved} fixed, {self.regressed} broken; McNemar p={self.mcnemar_p:.3g}"
            f"{family})"
        )


_Task = TypeVar("_Task", bound=Hashable)

#: Fewest families for which :func:`compare_paired` resamples families: a bootstrap over a
#: handful of clusters misstates the spread (three families give three values to draw from).
MIN_FAMILIES = 10


def compare_paired(
    before: Mapping[_Task, bool],
    after: Mapping[_Task, bool],
    *,
    families: Mapping[_Task, Hashable] | None = None,
    seed: int = 0,
) -> PairedComparison:
    """Compare ``{task: solved}`` before and after on the tasks both maps hold (a task dropped
    by either measurement is left out of the pairs).

    ``families``: ``{task: family}`` (e.g. the template a task was drawn from; a task it does
    not name is a family of its own). Where some family holds several of the pairs and there
    are at least :data:`MIN_FAMILIES` families, the result also carries the cluster bootstrap's
    interval (:attr:`PairedComparison.family_ci95_points`)."""
    keys = sorted(set(before) & set(after), key=repr)
    if not keys:
        raise ValueError("the two measurements share no task")
    b = [float(bool(before[k])) for k in keys]
    a = [float(bool(after[k])) for k in keys]
    improved = sum(1 for x, y in zip(b, a, strict=True) if y > x)
    regressed = sum(1 for x, y in zip(b, a, strict=True) if y < x)
    lo, hi = paired_bootstrap(b, a, seed=seed)
    n = len(keys)
    labels = [(0, families[k]) if families and k in families else (1, k) for k in keys]
    k_families = len(set(labels))
    family_ci = None
    if MIN_FAMILIES <= k_families < n:  # families of several tasks: resample them whole
        flo, fhi = paired_bootstrap(b, a, clusters=labels, seed=seed)
        family_ci = (100 * flo, 100 * fhi)
    return PairedComparison(
        n=n,
        before=sum(b) / n,
        after=sum(a) / n,
        improved=improved,
        regressed=regressed,
        gain_points=100 * (sum(a) - sum(b)) / n,
        ci95_points=(100 * lo, 100 * hi),
        mcnemar_p=mcnemar_p(improved, regressed),
        families=k_families if family_ci is not None else None,
        family_ci95_points=family_ci,
    )
