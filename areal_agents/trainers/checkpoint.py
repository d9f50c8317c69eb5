"""Atomic checkpoints: everything is written into a temporary directory, then renamed.

A directory ``checkpoints/step_000004`` either exists complete or not at all, whatever moment a
``kill -9`` lands: the rename is the commit. Leftover ``*.tmp-*`` directories from a killed
run are removed on the next start. The newest ``keep`` checkpoints are kept.

A checkpoint holds (see ``trainers/loop.py``): ``learner/`` (model, optimizer, scheduler,
critic and RNG state of every rank), ``buffer.json`` (data cursor, in-flight tasks, ready
groups), ``trainer.json`` (step, version, counters) and ``rng.pkl`` (the driver's RNG).

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> from areal_agents.files import read_json, write_json
>>> ckpt = CheckpointManager(root, keep=2)
>>> for step in (1, 2, 3):
...     tmp = ckpt.begin(step)
...     write_json(tmp / "trainer.json", {"step": step})
...     _ = ckpt.commit(tmp, step)
>>> [p.name for p in ckpt.all()]
['step_000002', 'step_000003']
>>> read_json(ckpt.latest() / "trainer.json")
{'step': 3}
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from areal_agents.files import fsync_directory

__all__ = [
    "CheckpointManager",
    "capture_rng",
    "load_rng",
    "read_files",
    "restore_rng",
    "save_rng",
    "write_files",
]

_NAME = re.compile(r"^step_(\d{6,})$")


def capture_rng() -> dict[str, Any]:
    """The state of Python's, NumPy's and (if imported) torch's global generators."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    try:
        import torch

        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
    except ImportError:  # pragma: no cover - torch is a train dependency
        pass
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def save_rng(path: str | os.PathLike[str]) -> None:
    with open(path, "wb") as f:
        pickle.dump(capture_rng(), f)


def load_rng(path: str | os.PathLike[str]) -> None:
    with open(path, "rb") as f:
        restore_rng(pickle.load(f))  # our own file, written by save_rng


class CheckpointManager:
    """Numbered checkpoint directories under ``root``, committed by rename."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 2, *, create: bool = True) -> None:
        """``create=False``: only read what is there (a missing ``root`` holds no checkpoint),
        as when a run directory is looked at before the run is accepted."""
        self.root = Path(root)
        self.keep = max(1, keep)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def clean_partial(self) -> list[Path]:
        """Remove temporary directories left by a killed run; returns what was removed."""
        removed = [p for p in self.root.glob("*.tmp-*") if p.is_dir()]
        for p in removed:
            shutil.rmtree(p, ignore_errors=True)
        return removed

    def begin(self, step: int) -> Path:
        """A fresh temporary directory to write checkpoint ``step`` into."""
        tmp = self.root / f"step_{step:06d}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int) -> Path:
        """Make ``tmp`` checkpoint ``step`` (atomic rename), then drop the oldest extra ones."""
        final = self.root / f"step_{step:06d}"
        if final.exists():  # re-saving a step (a resumed run): replace it
            old = final.with_name(final.name + f".tmp-old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_directory(self.root)
        for stale in self.all()[: -self.keep]:
            shutil.rmtree(stale, ignore_errors=True)
        return final

    def all(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)]
        return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    @staticmethod
    def step_of(path: Path) -> int:
        match = _NAME.match(path.name)
        if match is None:
            raise ValueError(f"{path} is not a checkpoint directory")
        return int(match.group(1))


def read_files(directory: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file directly in ``directory``, by name: a checkpoint part on its way from a node
    to the driver (the run directory lives with the driver only)."""
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}


def write_files(files: dict[str, bytes], directory: str | os.PathLike[str]) -> Path:
    """Undo :func:`read_files` into ``directory`` (created if needed)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        (out / name).write_bytes(data)
    return out
