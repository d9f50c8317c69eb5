"""examples/cpu_quickstart: task splits, demonstrations and the evaluation command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.cpu_quickstart import tasks
from examples.cpu_quickstart.evaluate import eval_command


def test_warm_start_and_heldout_tasks_are_disjoint() -> None:
    heldout = set(tasks.ids(tasks.heldout_seeds(64)))
    warm = tasks.ids(tasks.warm_start_seeds(64, heldout=64))
    assert len(heldout) > 60 and not heldout & set(warm)


def test_overlap_with_training_counts_heldout_tasks(tmp_path: Path) -> None:
    from areal_agents.trainers.data import task_seed

    # a fake run "trained" on tasks 0..3; none is a held-out task
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"batch/task_indices": [0, 1]}\n{"batch/task_indices": [2, 3]}\n')
    got = tasks.overlap_with_training(path, data_seed=0, heldout=64)
    assert got == {"trained_tasks": 4, "heldout_overlap": 0}
    assert task_seed(0, 0) != tasks.HELDOUT_SEED0


def test_demonstrations_mask_exactly_the_assistant_turns() -> None:
    from transformers import AutoTokenizer

    from areal_agents.serving.model import default_model_path
    from examples.cpu_quickstart.warm_start import encode_demonstration

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    seed = tasks.warm_start_seeds(1, heldout=8)[0]
    task = tasks.task_for_seed(seed)
    ids, mask = encode_demonstration(tokenizer, *tasks.demonstration(seed))
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    expression = task.metadata["expression"]
    assert trained == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression
        + '"}}\n</tool_call><|im_end|>The answer is \\boxed{' + str(task.answer) + "}.<|im_end|>"
    )  # fmt: skip
    ids, mask = encode_demonstration(tokenizer, *tasks.demonstration(seed, use_tool=False))
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == f"The answer is \\boxed{{{task.answer}}}.<|im_end|>"


def test_a_dialogue_demonstration_asks_each_question_after_the_last_answer() -> None:
    from transformers import AutoTokenizer

    from areal_agents.serving.model import default_model_path
    from examples.cpu_quickstart.warm_start import encode_demonstration

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    first, second = tasks.warm_start_seeds(2, heldout=8)
    messages, _ = tasks.dialogue([first, second], [True, False])
    roles = [m.role for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert messages[5].content == tasks.task_for_seed(second).prompt
    ids, mask = encode_demonstration(tokenizer, *tasks.dialogue([first, second], [True, False]))
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    answer = tasks.task_for_seed(second).answer
    assert trained.count("<|im_end|>") == 3  # the call, the first answer, the direct second
    assert trained.endswith(f"The answer is \\boxed{{{answer}}}.<|im_end|>")


def test_eval_command_uses_the_heldout_seeds() -> None:
    command = eval_command("some/model", "out", tasks=32, temperature=1.0)
    assert command[1:3] == ["-m", "areal_agents.eval"]
    assert f"seed={tasks.HELDOUT_SEED0}" in command and "num_episodes=32" in command
    assert "policy.model=some/model" in command
    from areal_agents.config import load_config
    from areal_agents.eval_config import EvalConfig

    cfg = load_config(EvalConfig, command[3:])  # valid keys; re-measuring replaces the results
    assert cfg.overwrite and cfg.temperature == 1.0 and cfg.samples_per_task == 1


@pytest.mark.parametrize("key", ["env", "algo", "trainer", "inference"])
def test_the_config_loads_with_the_trainer(key: str) -> None:
    from areal_agents.config import load_config
    from areal_agents.trainers.config import TrainConfig

    config = Path(tasks.__file__).with_name("config.yaml")
    cfg = load_config(TrainConfig, [f"config={config}", "model=tiny"])
    assert getattr(cfg, key) is not None
    assert cfg.env.name == "calculator" and cfg.algo.loss == "decoupled_ppo"
