"""Every HumanEval canonical solution still scores 1 under the host-side judge (and a wrong
answer to each scores 0): the judge runs the real test programs with the prompts' helpers."""

from __future__ import annotations

import pytest

from areal_agents.envs.tasks.code import humaneval_tasks
from areal_agents.rewards import UnitTestReward, UnitTests
from areal_agents.sandboxes import make_sandbox


@pytest.mark.bubblewrap
def test_all_164_canonical_solutions_score_one() -> None:
    reward = UnitTestReward()
    tasks = list(humaneval_tasks())
    assert len(tasks) == 164
    failed = []
    with make_sandbox("bubblewrap") as sandbox:
        for task in tasks:
            tests = UnitTests.from_mapping(task.metadata)
            result = reward.check(task.metadata["canonical_solution"], tests, sandbox=sandbox)
            if (result.reward, result.status) != (1.0, "correct"):
                failed.append((task.id, result))
            if task.id in ("HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/53"):
                wrong = f"def {tests.entry_point}(*args, **kwargs):\n    return None\n"
                result = reward.check(wrong, tests, sandbox=sandbox)
                if result.reward != 0.0:
                    failed.append((task.id + " (wrong)", result))
    assert failed == []
