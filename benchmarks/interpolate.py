"""Held-out success between an RL run's start and its end: ``start + alpha * (end - start)``.

Interpolating fine-tuned weights back toward their start (WiSE-FT, Wortsman et al., 2022; WARP's
"linear interpolation towards the initialisation", Ramé et al., 2024) keeps part of what
training learned and gives up part of its drift. Whether it does so here is measured post hoc,
without training anything again: the run's final weights (``<run>/weights/v*``, the newest) and
its start (the run's ``model``: the warm start, for the runs of :mod:`benchmarks.rl_gain`) are
mixed tensor by tensor, served by the built-in server, and scored on the run's held-out tasks
exactly as the run's own evaluation scored them (``trainers.held_out.evaluate`` with the run's
``config.yaml``); the outcomes are paired task by task with the run's "before" evaluation, as
:func:`benchmarks.rl_gain.paired` pairs a run's (split where its warm start left families out).

    python -m benchmarks.interpolate runs/rl_gain_norm/code_sandbox-seed0/norm_default --alpha 0.5

``--alpha 1`` re-scores the run's own final weights (a check that this path reproduces the run's
evaluation); ``alpha > 1`` extrapolates past them (ExPO, Zheng et al., 2024: the update's
direction kept, its length scaled up). Each mix is also scored on the run's validation tasks
(``eval.validation_tasks``, the ones that choose a run's final policy), so that whether the
choice would take it is measured too. Results: ``<run>/interpolated/alpha<A>/`` (the weights,
``eval`` and ``validation``) and one entry per run and alpha in
``benchmarks/results/interpolate.json``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from areal_agents.files import read_json, write_json

__all__ = ["before_dir", "interpolate", "main", "score"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "interpolate.json"


def interpolate(
    start: Mapping[str, torch.Tensor], end: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """``start + alpha * (end - start)`` for every tensor, computed in float32 and returned in
    each tensor's own dtype (0: the start, 1: the end).

    >>> a, b = {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([1.0, 4.0])}
    >>> interpolate(a, b, 0.5)["w"].tolist()
    [0.5, 3.0]
    """
    if start.keys() != end.keys():
        raise ValueError(f"the two models differ in tensors: {sorted(start.keys() ^ end.keys())}")
    out = {}
    for name, s in start.items():
        e = end[name]
        if s.shape != e.shape:
            raise ValueError(f"{name}: shape {tuple(s.shape)} against {tuple(e.shape)}")
        out[name] = (s.float() + alpha * (e.float() - s.float())).to(s.dtype)
    return out


def before_dir(run: Path) -> Path:
    """The run's evaluation before RL: its own ``eval/before``, or the one its seed's runs share
    (:mod:`benchmarks.rl_gain` scores the warm start once per seed)."""
    own = run / "eval" / "before"
    return own if own.is_dir() else run.parent / "before"


def _final_weights(run: Path) -> Path:
    found = sorted((run / "weights").glob("v*"))
    if not found:
        raise FileNotFoundError(f"{run}/weights holds no final weights (v*)")
    return found[-1]


def score(run: Path, alpha: float) -> dict[str, Any]:
    """Mix the run's start and final weights at ``alpha``, score the mix on the run's held-out
    tasks, and pair it with the run's before-RL outcomes."""
    from safetensors.torch import load_file, save_file

    from areal_agents.config import load_config
    from areal_agents.serving.server import BuiltinServer
    from areal_agents.trainers.config import TrainConfig
    from areal_agents.trainers.held_out import evaluate
    from benchmarks.rl_gain import paired

    cfg = load_config(TrainConfig, [f"config={run / 'config.yaml'}"])
    start_dir, end_dir = Path(cfg.model.name), _final_weights(run)
    out = run / "interpolated" / f"alpha{alpha:g}"
    model = out / "model"
    shutil.rmtree(out, ignore_errors=True)
    model.mkdir(parents=True)
    for f in start_dir.iterdir():  # the tokenizer, the chat template, the config
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, model / f.name)
    mixed = interpolate(
        load_file(start_dir / "model.safetensors"), load_file(end_dir / "model.safetensors"), alpha
    )
    save_file(mixed, str(model / "model.safetensors"), metadata={"format": "pt"})
    started = time.time()
    tasks, first = cfg.eval.validation_count, cfg.eval.held_out_tasks
    with BuiltinServer(str(model), served_model_name="policy") as server:
        result = evaluate(cfg, server.base_url, "policy", out / "eval")
        validation = (
            evaluate(cfg, server.base_url, "policy", out / "validation", tasks=tasks, first=first)
            if tasks
            else {}
        )
    before = before_dir(run)  # the run's split, where its warm start left families out
    held_out = paired(before, out / "eval", cfg.warm_start.exclude_families)
    if held_out is None:
        raise FileNotFoundError(f"{before} or {out / 'eval'} holds no held-out outcomes")
    return {
        "run": str(run),
        "alpha": alpha,
        "start": str(start_dir),
        "end": str(end_dir),
        "success": result.get("success"),
        "validation_success": validation.get("success"),
        "held_out": held_out,
        "eval_s": round(time.time() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (with weights/v*)")
    parser.add_argument("--alpha", type=float, default=0.5, help="0: the start, 1: the end")
    args = parser.parse_args(argv)
    entries = read_json(RESULTS) if RESULTS.is_file() else []
    for run in args.runs:
        entry = score(run, args.alpha)
        entries = [e for e in entries if (e["run"], e["alpha"]) != (entry["run"], entry["alpha"])]
        entries.append(entry)
        write_json(RESULTS, entries)
        h = entry["held_out"]
        print(
            f"{run} alpha {args.alpha:g}: {h['before']:.1%} -> {h['after']:.1%}, "
            f"{h['gain_points']:+.1f} points ({h['ci95_points'][0]:+.1f} to "
            f"{h['ci95_points'][1]:+.1f}), {h['improved']} fixed / {h['regressed']} broken"
        )


if __name__ == "__main__":
    main()
