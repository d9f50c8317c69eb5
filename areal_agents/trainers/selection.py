"""The run's final policy, chosen on validation tasks (``eval.validation_tasks``).

An RL step moves the policy by noise as well as by the rewards' signal: the same run with
shuffled rewards (the placebo, ``algo.shuffle_rewards``) moves held-out success by 5 to 40
points (``benchmarks/README.md`` section 12), so the last step is not always the best policy
the run had. As supervised fine-tuning keeps its best checkpoint on a development set
(Hugging Face's ``load_best_model_at_end``), the run keeps candidates (the weights RL starts
from, those of every ``eval.validation_every`` steps and the last step's, in
``<run>/candidates``), scores each on validation tasks that are neither trained on nor held
out (``<run>/eval/validation/step_NNNNNN``), and makes the best the final policy; equal scores
keep the earliest, the one the rewards moved least. The held-out tasks then score the chosen
policy (``<run>/eval/after``), and the last step's as well when it was not chosen
(``<run>/eval/last``), so that what the choice changed is measured, not hidden.

The validation tasks follow the held-out ones: task ``i`` is the one
``env.reset(seed=eval.seed + eval.held_out_tasks + i)`` draws
(:func:`~areal_agents.trainers.held_out.held_out_task_ids` keeps both out of training).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from areal_agents.serving.staging import checkpoint_tensors
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import evaluate

__all__ = [
    "candidate_dir",
    "candidate_steps",
    "choose_final",
    "final_evaluations",
    "final_weights",
    "keep_candidate",
    "selecting",
]


def selecting(cfg: TrainConfig) -> bool:
    """Whether the run chooses its final policy on validation tasks: ``eval.validation_tasks``
    resolves to more than 0 and the servers are given full weights (not a LoRA adapter served
    by vLLM, where the client names the adapter on top of the base, so a candidate could not
    be swapped in). Elsewhere the last step is final. On a cluster (``ray.address``) too: the
    candidates come to the driver's disk and go to the server as tensors (:func:`_load`)."""
    if cfg.eval.validation_count <= 0:
        return False
    return not (cfg.model.lora.enabled and cfg.inference.engine == "vllm")


def candidate_dir(run_dir: Path, step: int) -> Path:
    """Where the weights after step ``step`` wait as a candidate (step 0: RL's start)."""
    return run_dir / "candidates" / f"step_{step:06d}"


def candidate_steps(run_dir: Path) -> list[int]:
    """The steps whose candidate weights are kept in ``run_dir``, in order."""
    root = run_dir / "candidates"
    if not root.is_dir():
        return []
    return sorted(
        int(p.name.removeprefix("step_"))
        for p in root.glob("step_*")
        if p.is_dir() and p.name.removeprefix("step_").isdigit()
    )


def keep_candidate(
    cfg: TrainConfig, learners: Any, run_dir: Path, step: int, *, last: bool = False
) -> bool:
    """Export the learners' weights as the candidate of step ``step`` when one is due (step 0,
    every ``eval.validation_every`` steps, and the ``last`` step) and not already kept;
    whether it exported. Collective on the learners; on the driver's disk (a cluster's rank 0
    sends its files); written to a temporary name first, so that a killed run leaves no
    half-written candidate."""
    due = step % cfg.eval.validation_every == 0 or last
    target = candidate_dir(run_dir, step)
    if not selecting(cfg) or not due or target.is_dir():
        return False
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    learners.export_weights_to_driver(partial)
    os.replace(partial, target)
    return True


def _load(server: Any, path: Path, version: int, cfg: TrainConfig) -> None:
    """Serve the candidate at ``path`` as ``version``: from the disk it is on, or, on a cluster
    (where the server's node need not share the driver's disk), as tensors sent to it."""
    timeout = cfg.inference.weight_sync_timeout_s
    if not cfg.ray.address:
        server.update_weights_from_disk(str(path), version, timeout)
        return
    server.update_weights_from_state_dict(checkpoint_tensors(path), version, timeout)


def choose_final(
    cfg: TrainConfig, server: Any, served_name: str, run_dir: Path, last_step: int
) -> tuple[dict[str, Any], int]:
    """Score every kept candidate up to ``last_step`` on the validation tasks against
    ``server`` and leave the best loaded there (the earliest of equal scores). Returns the
    selection (``candidates``: ``{step: success}``, ``chosen_step``, ``last_step``,
    ``tasks`` and ``every``; :func:`final_weights` adds ``weights`` once it has kept the one
    copy) and the weight version the server now serves. Every candidate stays on disk until
    then, so that a run killed here scores them all again.

    The server is given each candidate as a new weight version above ``last_step`` (vLLM
    accepts only increasing versions)."""
    steps = [s for s in candidate_steps(run_dir) if s <= last_step]
    if not steps:
        raise FileNotFoundError(f"no candidate weights under {run_dir / 'candidates'}")
    tasks = cfg.eval.validation_count
    scores: dict[int, float] = {}
    version = last_step
    for step in steps:
        version += 1
        _load(server, candidate_dir(run_dir, step), version, cfg)
        result = evaluate(
            cfg,
            str(server.base_url),
            served_name,
            run_dir / "eval" / "validation" / f"step_{step:06d}",
            tasks=tasks,
            first=cfg.eval.held_out_tasks,
        )
        scores[step] = float(result["success"] or 0.0)
    chosen = max(steps, key=lambda s: (scores[s], -s))  # the earliest of the best
    if chosen != steps[-1]:
        version += 1
        _load(server, candidate_dir(run_dir, chosen), version, cfg)
    selection = {
        "tasks": tasks,
        "every": cfg.eval.validation_every,
        "candidates": {str(s): scores[s] for s in steps},
        "chosen_step": chosen,
        "last_step": last_step,
    }
    return selection, version


def final_evaluations(
    cfg: TrainConfig, learners: Any, server: Any, served_name: str, run_dir: Path, step: int
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
    """After the last step (rollouts stopped): ``(after, last, selection)``. With selection on,
    the final policy is chosen (:func:`choose_final`), the held-out tasks score it into
    ``eval/after`` and, when it is not the last step's, the last step's weights into
    ``eval/last``; without it ``after`` scores the
    weights served now and ``last`` and ``selection`` are None. Each is None where
    ``eval.held_out_tasks`` is 0."""
    held_out = cfg.eval.held_out_tasks
    url = str(server.base_url)
    if not selecting(cfg):
        after = evaluate(cfg, url, served_name, run_dir / "eval" / "after") if held_out else None
        return after, None, None
    keep_candidate(cfg, learners, run_dir, step, last=True)
    selection, version = choose_final(cfg, server, served_name, run_dir, step)
    after = last = None
    if held_out:
        after = evaluate(cfg, url, served_name, run_dir / "eval" / "after")
    if held_out and selection["chosen_step"] != step:
        _load(server, candidate_dir(run_dir, step), version + 1, cfg)
        last = evaluate(cfg, url, served_name, run_dir / "eval" / "last")
    return after, last, selection


def final_weights(run_dir: Path, selection: dict[str, Any] | None, step: int) -> Path:
    """The directory of the final policy's weights, the one copy kept (recorded as the
    selection's ``weights``): the last step's served weights (``<run>/weights/vNNNNNN``, where
    the weight sync wrote them) unless validation chose an earlier candidate, or the sync wrote
    none on the driver's disk (on a cluster), whose candidate directory it then is (the last
    step's weights stay in its checkpoint). Every other candidate goes."""
    served = run_dir / "weights" / f"v{step:06d}"
    if selection is None:
        return served
    chosen = int(selection["chosen_step"])
    final = served if chosen == step and served.is_dir() else candidate_dir(run_dir, chosen)
    for kept in candidate_steps(run_dir):
        if candidate_dir(run_dir, kept) != final:
            shutil.rmtree(candidate_dir(run_dir, kept), ignore_errors=True)
    if final != served:
        shutil.rmtree(served, ignore_errors=True)
    selection["weights"] = str(final)
    return final
