"""What the training command's tests share: the tiny run's overrides and a way to start the
command as its own process (its own session, so a test can signal its whole tree)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The smallest batch and the quietest logs a real run of the command can have.
TINY_SIZES = (
    "env.group_size=2",
    "trainer.groups_per_step=2",
    "inference.max_tokens=8",
    "log.progress=false",
    "log.tensorboard=false",
    "ray.num_cpus=2",
)
TINY = ["env=calculator", "model=tiny", *TINY_SIZES, "eval.held_out_tasks=0"]


def run(
    args: list[str], env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "areal_agents.train", *args],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        **kwargs,  # type: ignore[arg-type]
    )
