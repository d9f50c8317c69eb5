"""The supervised warm start the main command runs before RL: the code environment's reference
solutions, and the search environment's demonstrations played through the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_agents.config import load_config
from areal_agents.envs.registry import make_env
from areal_agents.errors import ConfigError
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import held_out_task_ids, task_family
from areal_agents.trainers.modeling import tiny_model_path
from areal_agents.trainers.warm_start import (
    demonstration_step,
    demonstrations,
    encode_demonstration,
    lean_finished_run,
)

CODE = ["env=code_sandbox", "env.kwargs={sandbox_backend: process}", "eval.held_out_tasks=8"]


def test_the_default_command_is_the_recipe() -> None:
    cfg = load_config(TrainConfig, [])
    assert cfg.env.name == "code_sandbox" and cfg.warm_start.steps > 0
    assert cfg.trainer.time_budget_s is not None and cfg.trainer.time_budget_s <= 20 * 60
    # the measured trust region (benchmarks/README.md section 12): a small step after a warm-up
    assert (cfg.trainer.optimizer, cfg.trainer.lr, cfg.trainer.warmup_steps) == ("adamw", 1e-5, 5)
    assert cfg.trainer.total_steps == 24 and cfg.trainer.lr_schedule == "constant"
    assert cfg.trainer.mode == "async" and cfg.trainer.effective_max_staleness == 2
    assert cfg.algo.for_mode(cfg.trainer.mode).loss == "decoupled_ppo"
    sync = load_config(TrainConfig, ["trainer.mode=sync"])  # the default is one key from sync
    assert sync.trainer.effective_max_staleness == 0
    assert sync.algo.for_mode(sync.trainer.mode).loss == "ppo_clip"
    assert load_config(TrainConfig, ["warm_start.steps=0"]).warm_start.steps == 0
    with pytest.raises(ConfigError, match=r"warm_start\.batch_size"):
        load_config(TrainConfig, ["warm_start.batch_size=0"])


def test_demonstrations_are_correct_solutions_of_non_held_out_tasks() -> None:
    cfg = load_config(TrainConfig, CODE)
    held_out = held_out_task_ids(cfg)
    assert held_out
    demos = demonstrations(cfg, 6, held_out)
    assert len(demos) == 6
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    try:
        for messages, tools in demos:
            assert [m["role"] for m in messages] == ["system", "user", "assistant"]
            assert {t["function"]["name"] for t in tools} == {"python", "submit"}
            task = env.unwrapped.get_task(_task_id(env, messages))
            assert task.id not in held_out
            env.reset(options={"task_id": task.id})
            _, reward, terminated, _, _ = env.step(messages[-1]["content"])
            assert terminated and reward == 1.0  # the reference solution passes the tests
    finally:
        env.close()
    # an environment without demonstrations gets none (and no warm start)
    assert demonstrations(load_config(TrainConfig, ["env=calculator"]), 4) == []


def test_each_trainer_seed_draws_its_own_demonstrations() -> None:
    prompts = {}
    for seed in (0, 1):
        cfg = load_config(TrainConfig, [*CODE, f"trainer.seed={seed}"])
        prompts[seed] = [str(m[1]["content"]) for m, _ in demonstrations(cfg, 4)]
        again = [str(m[1]["content"]) for m, _ in demonstrations(cfg, 4)]
        assert prompts[seed] == again  # a seed's demonstrations are fixed
    assert not set(prompts[0]) & set(prompts[1])


def test_excluded_families_are_never_demonstrated() -> None:
    cfg = load_config(TrainConfig, CODE)
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    try:
        shown = [_task_id(env, m) for m, _ in demonstrations(cfg, 8)]
        drop = sorted({task_family(t) or "" for t in shown})[:2]  # two families shown
        key = f"warm_start.exclude_families=[{','.join(drop)}]"
        cut = load_config(TrainConfig, [*CODE, key])
        kept = [_task_id(env, m) for m, _ in demonstrations(cut, 8)]
    finally:
        env.close()
    assert len(drop) == 2 and len(kept) == 8
    assert not {task_family(t) for t in kept} & set(drop)
    others = [t for t in shown if task_family(t) not in drop]
    assert others and kept[: len(others)] == others  # the same draws, those families skipped
    with pytest.raises(ConfigError, match=r"warm_start\.exclude_families: 'rotate'"):
        load_config(TrainConfig, [*CODE, "warm_start.exclude_families=[rotate]"])


def _task_id(env: object, messages: list[dict[str, object]]) -> str:
    """The procedural task whose prompt is the demonstration's user message."""
    prompt = str(messages[1]["content"])
    base = env.unwrapped  # type: ignore[attr-defined]
    for seed in range(1_500_000_000, 1_500_000_200):
        _, info = env.reset(seed=seed)  # type: ignore[attr-defined]
        if base.get_task(info["task_id"]).prompt == prompt:
            return str(info["task_id"])
    raise AssertionError("demonstration task not found")


SEARCH = ["env=search", "eval.held_out_tasks=8"]


def test_search_demonstrations_are_played_through_the_environment_and_score() -> None:
    cfg = load_config(TrainConfig, SEARCH)
    held_out = held_out_task_ids(cfg)
    demos = demonstrations(cfg, 6, held_out)
    assert len(demos) == 6
    for messages, tools in demos:
        assert {t["function"]["name"] for t in tools} == {"search"}
        roles = [m["role"] for m in messages]
        searches = roles.count("tool")
        # system, question, then (a search call, its result) per hop, then the answer
        assert roles == ["system", "user", *["assistant", "tool"] * searches, "assistant"]
        assert 1 <= searches <= cfg.env.max_turns - 1
        answer = str(messages[-1]["content"])
        assert answer.startswith("<answer>") and answer.endswith("</answer>")
        # each result is the environment's: it names the entity searched for next, and the
        # last one names the answer
        results = [str(m["content"]) for m in messages if m["role"] == "tool"]
        calls = [m["tool_calls"][0]["function"]["arguments"] for m in messages[2:-1:2]]
        for result, next_query in zip(results, calls[1:], strict=False):
            assert json.loads(next_query)["query"] in result
        assert answer.removeprefix("<answer>").removesuffix("</answer>") in results[-1]
    # the played episodes scored, and the held-out questions are not among them
    questions = {str(m[1]["content"]) for m, _ in demos}
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    try:
        held = {env.unwrapped.get_task(t).prompt for t in held_out}
    finally:
        env.close()
    assert not questions & held


def test_math_demonstrations_print_the_expression_and_box_the_printed_answer() -> None:
    cfg = load_config(TrainConfig, ["env=math_python", "env.kwargs={sandbox_backend: process}"])
    demos = demonstrations(cfg, 4, held_out_task_ids(cfg))
    assert len(demos) == 4
    for messages, tools in demos:
        assert {t["function"]["name"] for t in tools} == {"python"}
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        code = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])["code"]
        assert code.startswith("print(")
        printed = str(messages[3]["content"]).rsplit("stdout:\n", 1)[-1].strip()
        boxed = str(messages[4]["content"])
        assert boxed == f"\\boxed{{{printed}}}"  # the sandbox printed the answer it boxes
    # a math environment without the tool has nothing to demonstrate
    no_tool = load_config(
        TrainConfig, ["env=math_python", "env.kwargs={sandbox_backend: process, tools: []}"]
    )
    assert demonstrations(no_tool, 2) == []


def test_a_demonstration_that_does_not_score_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_agents.envs.search import SearchEnv

    real = SearchEnv.demonstration

    def wrong_answer(self: SearchEnv, task: object) -> list[dict[str, object]] | None:
        turns = real(self, task)  # type: ignore[arg-type]
        if turns is None:
            return None
        return [*turns[:-1], {"role": "assistant", "content": "<answer>Atlantis</answer>"}]

    monkeypatch.setattr(SearchEnv, "demonstration", wrong_answer)
    assert demonstrations(load_config(TrainConfig, SEARCH), 2) == []


def test_search_demonstrations_train_the_calls_and_the_answer_not_the_results() -> None:
    from transformers import AutoTokenizer

    (messages, tools), *_ = demonstrations(load_config(TrainConfig, SEARCH), 1)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    ids, mask = encode_demonstration(tokenizer, messages, tools)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained.count("<tool_call>") == sum(m["role"] == "tool" for m in messages)
    assert trained.endswith("</answer><|im_end|>")
    for m in messages:
        if m["role"] == "tool":
            assert str(m["content"]) not in trained  # the environment's text is not trained on


def test_the_loss_mask_covers_the_assistant_reply_through_im_end() -> None:
    from transformers import AutoTokenizer

    cfg = load_config(TrainConfig, CODE)
    (messages, tools), *_ = demonstrations(cfg, 1)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    ids, mask = encode_demonstration(tokenizer, messages, tools)
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
    first = mask.index(1)
    assert all(mask[first:]) or mask[first:].count(0) <= 2  # trailing newline after <|im_end|>
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained.startswith("```python\n") and trained.endswith("```<|im_end|>")
    assert str(messages[1]["content"]) not in trained  # the prompt is not trained on


def test_a_warm_start_step_is_the_mean_loss_over_exactly_the_trained_tokens() -> None:
    """Each row trains the tokens its mask marks after the first (position t predicts t + 1):
    the step's loss, and its gradient's scale, is the mean over exactly those, not over one
    fewer per row (the count it used to divide by)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(TrainConfig, CODE)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    rows = [encode_demonstration(tokenizer, m, t) for m, t in demonstrations(cfg, 3)]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    with torch.no_grad():  # the loss before the update, token by token
        nlls = []
        for ids, mask in rows:
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0, :-1].float()
            each = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")
            nlls.append(each[torch.tensor(mask[1:], dtype=torch.bool)])
    expected = float(torch.cat(nlls).mean())
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    loss = demonstration_step(model, opt, rows, max_grad_norm=1.0)
    assert loss == pytest.approx(expected, rel=1e-4)
    # one fewer token per row (the old count) would report the sum over fewer: visibly larger
    fewer = float(torch.cat(nlls).sum()) / (sum(len(n) for n in nlls) - len(rows))
    assert abs(loss - fewer) > 10 * abs(loss - expected)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert demonstration_step(model, opt, [([1, 2, 3], [1, 0, 0])], max_grad_norm=1.0) == 0.0


def test_a_finished_run_keeps_no_optimizer_state_nor_the_warm_start_copy(tmp_path: Path) -> None:
    learner = tmp_path / "checkpoints" / "step_000003" / "learner"
    learner.mkdir(parents=True)
    weights = torch.zeros(1000)
    torch.save(
        {"model": {"w": weights}, "optimizer": {"state": {0: torch.zeros(2000)}}},
        learner / "learner.pt",
    )
    torch.save({"step": 3, "scheduler": {}}, learner / "schedule.pt")
    (tmp_path / "warm_start").mkdir()
    (tmp_path / "warm_start" / "model.safetensors").write_bytes(b"x" * 100)
    lean_finished_run(tmp_path, learner.parent)
    assert not (tmp_path / "warm_start").exists()
    state = torch.load(learner / "learner.pt", weights_only=False)
    assert set(state) == {"model"} and torch.equal(state["model"]["w"], weights)
    schedule = torch.load(learner / "schedule.pt", weights_only=False)
    assert schedule["optimizer"] is False and schedule["step"] == 3
    lean_finished_run(tmp_path, learner.parent)  # idempotent
    assert set(torch.load(learner / "learner.pt", weights_only=False)) == {"model"}
