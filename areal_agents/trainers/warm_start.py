"""A short supervised warm start on demonstrations, run by the trainer before RL.

SmolLM2-135M-Instruct, asked for a function, mostly answers in prose or with a program that
does not load, and asked a question that needs the search tool, answers from nowhere without
calling it; RL then starts with almost no reward to compare within a group. A few supervised
steps on the environment's own demonstrations (:meth:`MultiTurnEnv.demonstration
<areal_agents.envs.base.MultiTurnEnv.demonstration>`: the code tasks' reference solutions, the
synthetic search questions' chains of searches) teach the answer format and the tool use. A
multi-turn demonstration is played through the environment, so its tool results are real, and
kept only when it scores. The demonstrations are rendered with the chat template the servers
and the learner use (tool schemas included), and the loss covers exactly the assistant tokens,
up to and including ``<|im_end|>``. No demonstration is a held-out task.

The result is written to ``<run>/warm_start`` (renamed into place when complete, so a killed
run either finds it whole or makes it again); the learners start from it, and the trainer
scores the held-out tasks on the model before and after it, so that its own gain is reported
apart from the gain of RL.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_agents.envs.registry import make_env
from areal_agents.files import write_json
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.data import task_family, task_id_of
from areal_agents.types import Message as TypedMessage

__all__ = [
    "DEMO_SEED",
    "DEMO_SEED_STRIDE",
    "NO_DEMONSTRATION_PROBE",
    "demonstration_backward",
    "demonstration_step",
    "demonstrations",
    "encode_demonstration",
    "lean_finished_run",
    "run_warm_start",
    "trained_tokens",
    "warm_start_info",
    "warm_start_threads",
]

DEMO_SEED = 1_500_000_000
"""Environment seed of the first demonstration of ``trainer.seed=0`` (far from the held-out
seeds 0, 1, ...)."""
DEMO_SEED_STRIDE = 1_000_000
"""Each trainer seed draws its own demonstrations: seed ``s`` starts at
``DEMO_SEED + s * DEMO_SEED_STRIDE``."""

Message = Mapping[str, Any]


NO_DEMONSTRATION_PROBE = 8
"""Tasks in a row without a demonstration, before any was found, that mean the environment has
none (``MultiTurnEnv.demonstration`` returns None for them)."""


def demonstrations(
    cfg: TrainConfig, n: int, exclude: frozenset[str] | None = None
) -> list[tuple[list[Message], list[Any]]]:
    """``n`` demonstrations ``(messages, tool schemas)`` from the environment: a task's opening
    messages followed by the turns of its ``MultiTurnEnv.demonstration``. A one-turn
    demonstration (a reference answer) is taken as written; a longer one is played through
    ``step``, so that its tool results are the environment's own, and kept only when it ends
    scoring full reward. ``[]`` when the environment has no demonstrations. Tasks whose id is in
    ``exclude``, or whose family is in ``warm_start.exclude_families``, are skipped. The tasks
    depend on ``trainer.seed`` (see :data:`DEMO_SEED_STRIDE`)."""
    families = frozenset(cfg.warm_start.exclude_families)
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    out: list[tuple[list[Message], list[Any]]] = []
    try:
        base = env.unwrapped
        hook = getattr(base, "demonstration", None)
        if hook is None:
            return []
        first = DEMO_SEED + cfg.trainer.seed * DEMO_SEED_STRIDE
        seed, misses = first, 0
        while len(out) < n and seed < first + 20 * n:
            obs, info = env.reset(seed=seed)
            seed += 1
            task = getattr(base, "task", None)
            if task is None:  # not a MultiTurnEnv: no task to demonstrate
                return []
            task_id = info.get("task_id") or task_id_of(env, seed - 1)
            if (exclude and task_id in exclude) or task_family(task_id) in families:
                continue
            turns = hook(task)
            if not turns:
                misses += 1
                if not out and misses >= NO_DEMONSTRATION_PROBE:
                    return []  # this environment has no demonstrations
                continue
            messages = _played(env, [dict(m) for m in obs], turns)
            if messages is not None:
                out.append((messages, list(info.get("tools") or [])))
    finally:
        env.close()
    return out


def _played(env: Any, messages: list[Message], turns: Sequence[Message]) -> list[Message] | None:
    """``messages`` with ``turns`` and the environment's replies to them, or None if a played
    demonstration does not end on full reward (one turn: appended as it is, not graded)."""
    if len(turns) == 1:
        return [*messages, dict(turns[0])]
    reward, terminated, done = 0.0, False, 0
    for turn in turns:
        messages.append(dict(turn))
        obs, reward, terminated, truncated, _ = env.step(dict(turn))
        messages.extend(dict(m) for m in obs)
        done += 1
        if terminated or truncated:
            break
    return messages if terminated and done == len(turns) and reward >= 1.0 else None


def encode_demonstration(
    tokenizer: Any, messages: Sequence[Message | TypedMessage], tools: Sequence[Any]
) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and a 0/1 mask over the assistant turns' tokens, each up
    to its ``<|im_end|>`` (messages as dicts or :class:`~areal_agents.types.Message`)."""
    from areal_agents.policies.templates import render_prompt_ids

    def ids(upto: int, gen: bool) -> list[int]:
        return render_prompt_ids(tokenizer, messages[:upto], tools, add_generation_prompt=gen)

    full = ids(len(messages), False)
    mask = [0] * len(full)
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k, message in enumerate(messages):
        role = message["role"] if isinstance(message, Mapping) else message.role
        if role != "assistant":
            continue
        start, stop = ids(k, True), ids(k + 1, False)
        if full[: len(stop)] != stop or stop[: len(start)] != start:
            raise ValueError("the chat template does not tokenise prefix-consistently")
        end = len(stop)
        while end > len(start) and stop[end - 1] != end_id:  # train up to <|im_end|>
            end -= 1
        for i in range(len(start), end):
            mask[i] = 1
    return full, mask


def demonstration_backward(
    model: Any, rows: Sequence[tuple[list[int], list[int]]], weight: float, device: Any = None
) -> float:
    """Add the gradient of ``weight`` times the summed negative log-likelihood of ``rows``'
    trained tokens (``(ids, mask)`` as :func:`encode_demonstration` makes them, each token
    predicted from the ones before it) to the causal LM ``model``'s; returns that sum. One row
    at a time (no padding), with logits at the trained positions only (little memory); through
    the model's own forward, so an FSDP-sharded learner gathers its weights as it does for RL."""
    import torch

    total = 0.0
    for ids, mask in rows:
        x = torch.tensor([ids], device=device)
        keep = torch.tensor([i for i, m in enumerate(mask[1:]) if m], dtype=torch.long)
        keep = keep.to(x.device)  # position t predicts token t + 1
        logits = model(input_ids=x, logits_to_keep=keep).logits[0].float()
        loss = torch.nn.functional.cross_entropy(logits, x[0, keep + 1], reduction="sum")
        (loss * weight).backward()
        total += float(loss.detach())
    return total


def trained_tokens(rows: Sequence[tuple[list[int], list[int]]]) -> int:
    """How many tokens ``rows`` train: position ``t`` predicts token ``t + 1``, so a row's
    trained tokens are its mask's ones after the first token (the mean's denominator of
    :func:`demonstration_step` and of the replay).

    >>> trained_tokens([([5, 6, 7, 8], [0, 1, 1, 1]), ([5, 6], [1, 1])])
    4
    """
    return sum(sum(mask[1:]) for _, mask in rows)


def demonstration_step(
    model: Any, optimizer: Any, rows: Sequence[tuple[list[int], list[int]]], max_grad_norm: float
) -> float:
    """One supervised update of ``model`` on ``rows``: the mean negative log-likelihood per
    trained token (:func:`trained_tokens`), its gradient clipped to ``max_grad_norm``; returns
    that mean (0.0, and no update, when ``rows`` train no token)."""
    import torch

    targets = trained_tokens(rows)
    if not targets:
        return 0.0
    optimizer.zero_grad(set_to_none=True)
    total = demonstration_backward(model, rows, 1.0 / targets)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return total / targets


def run_warm_start(
    cfg: TrainConfig, model_dir: Path, run_dir: Path, exclude: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """Fine-tune the model in ``model_dir`` for ``cfg.warm_start.steps`` steps and save it to
    ``<run_dir>/warm_start``; returns what was done (``steps``, ``demos``, ``losses``,
    ``train_s``, also written to ``<run_dir>/warm_start.json``), or None when it does not apply
    (``steps=0``, or no demonstrations). A complete one (a killed run's) is reused."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_agents.files import read_json

    ws = cfg.warm_start
    if ws.steps == 0:
        return None
    out = run_dir / "warm_start"
    if (out / "warm_start.json").is_file():
        return dict(read_json(out / "warm_start.json"))
    demos = demonstrations(cfg, ws.steps * ws.batch_size, exclude)
    if not demos:
        print(f"warm start skipped: {cfg.env.name}'s tasks carry no demonstration")
        return None
    start = time.perf_counter()
    threads = torch.get_num_threads()
    # nothing else computes while it runs (the servers have loaded and wait): every core
    torch.set_num_threads(max(warm_start_threads(), cfg.trainer.torch_threads or 1))
    torch.manual_seed(cfg.trainer.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    policy: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    policy.train()
    data = [encode_demonstration(tokenizer, m, t) for m, t in demos]
    random.Random(cfg.trainer.seed).shuffle(data)
    opt = torch.optim.AdamW(policy.parameters(), lr=ws.lr, weight_decay=0.0)
    losses: list[float] = []
    for step in range(ws.steps):
        rows = data[step * ws.batch_size : (step + 1) * ws.batch_size]
        losses.append(round(demonstration_step(policy, opt, rows, max_grad_norm=1.0), 4))
        print(f"warm start step {step + 1}/{ws.steps}: loss {losses[-1]:.4f}", flush=True)
    info = {
        "steps": ws.steps,
        "batch_size": ws.batch_size,
        "lr": ws.lr,
        "demos": len(data),
        "exclude_families": list(ws.exclude_families),
        "losses": losses,
        "train_s": round(time.perf_counter() - start, 1),
        "torch_threads": torch.get_num_threads(),
    }
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    template = model_dir / "chat_template.jinja"
    if template.is_file():  # the tool template travels with the weights
        shutil.copy(template, tmp / "chat_template.jinja")
    write_json(tmp / "warm_start.json", info)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    write_json(run_dir / "warm_start.json", info)
    del policy, opt
    torch.set_num_threads(threads)
    return info


def warm_start_threads() -> int:
    """Torch threads of the warm start: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def warm_start_info(run_dir: Path) -> dict[str, Any] | None:
    """What the run's warm start did (``<run>/warm_start.json``), or None if it had none."""
    from areal_agents.files import read_json

    path = run_dir / "warm_start.json"
    return dict(read_json(path)) if path.is_file() else None


def lean_finished_run(run_dir: Path, checkpoint: Path | None) -> None:
    """Trim a finished run's directory to the final weights plus a small resumable checkpoint:
    the warm-started copy of the model goes (a resumed run starts from the checkpoint, which
    holds every weight), and the last checkpoint keeps the model but drops the optimizer state
    (twice the model's size in fp32 with AdamW); a run extended from it (a larger
    ``trainer.total_steps``) starts with fresh optimizer moments."""
    import torch

    shutil.rmtree(run_dir / "warm_start", ignore_errors=True)
    if checkpoint is None:
        return
    learner = checkpoint / "learner"
    state_path, schedule_path = learner / "learner.pt", learner / "schedule.pt"
    if not state_path.is_file() or not schedule_path.is_file():
        return
    schedule = torch.load(schedule_path, map_location="cpu", weights_only=False)
    if schedule.get("optimizer") is False:
        return
    state = torch.load(state_path, map_location="cpu", weights_only=False)
    for key in ("optimizer", "critic_optimizer"):
        state.pop(key, None)
    tmp = state_path.with_name("learner.pt.tmp")
    torch.save(state, tmp)
    del state
    os.replace(tmp, state_path)
    schedule["optimizer"] = False  # read by every rank: none of them loads optimizer state
    torch.save(schedule, schedule_path.with_name("schedule.pt.tmp"))
    os.replace(schedule_path.with_name("schedule.pt.tmp"), schedule_path)
