"""LoRA adapters on the serving side: the adapter's wire format, merging it onto base weights,
and the request that makes vLLM load one at run time.

An adapter travels in PEFT's saved format, so that vLLM and PEFT read the same files: tensors
named ``base_model.model.<module>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight``
(``[out, in]`` after ``B @ A``), plus a ``scaling`` (``alpha / r``). The built-in server applies
one with :class:`AdapterMerger`: it keeps the original weight of every module an adapter
touches and serves ``W0 + scaling * B @ A``, so a new adapter replaces the previous one (never
adds to it) and the base is never sent again.

>>> import torch
>>> w0 = {"m.weight": torch.zeros(2, 3)}
>>> a, b = torch.ones(1, 3), torch.full((2, 1), 2.0)
>>> adapter = {"base_model.model.m.lora_A.weight": a, "base_model.model.m.lora_B.weight": b}
>>> merger = AdapterMerger()
>>> merger.merged(w0, adapter, scaling=0.5)["m.weight"].tolist()
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
>>> merger.merged(w0, adapter, scaling=0.0)["m.weight"].tolist()  # the base, not the sum
[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.errors import WeightSyncError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PEFT_PREFIX",
    "AdapterMerger",
    "adapter_modules",
    "load_lora_request",
    "save_adapter_dir",
]

PEFT_PREFIX = "base_model.model."
"""The prefix PEFT gives adapter tensor names in saved adapters (vLLM expects it)."""


def adapter_modules(adapter: Mapping[str, torch.Tensor]) -> dict[str, tuple[Any, Any]]:
    """Module name (HF, without :data:`PEFT_PREFIX`) -> ``(lora_A, lora_B)`` of ``adapter``;
    a :class:`WeightSyncError` for a tensor that is neither, or a half pair."""
    pairs: dict[str, dict[str, Any]] = {}
    for name, tensor in adapter.items():
        short = name.removeprefix(PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if short.endswith(suffix):
                pairs.setdefault(short[: -len(suffix)], {})[part] = tensor
                break
        else:
            raise WeightSyncError(f"adapter tensor {name!r} is neither lora_A nor lora_B")
    out = {}
    for module, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise WeightSyncError(f"adapter module {module!r} lacks lora_A or lora_B")
        out[module] = (pair["lora_A"], pair["lora_B"])
    return out


class AdapterMerger:
    """The built-in server's side of an adapter push: originals kept, one adapter merged."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}
        """``<module>.weight`` -> its weight before any adapter (a copy)."""

    def merged(
        self,
        weights: Mapping[str, torch.Tensor],
        adapter: Mapping[str, torch.Tensor],
        scaling: float,
    ) -> dict[str, torch.Tensor]:
        """New values of the weights ``adapter`` touches: ``W0 + scaling * B @ A``, where
        ``W0`` is the weight as it was before the first adapter (``weights`` holds the served
        tensors by HF name). A module a previous adapter touched and this one does not goes
        back to ``W0``."""
        import torch

        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for module, (a, b) in adapter_modules(adapter).items():
                name = f"{module}.weight"
                current = weights.get(name)
                if current is None:
                    raise WeightSyncError(f"adapter module {module!r}: no weight {name!r} served")
                if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                    raise WeightSyncError(
                        f"adapter module {module!r}: lora_A {tuple(a.shape)} and lora_B "
                        f"{tuple(b.shape)} are not [r, in] and [out, r]"
                    )
                if (b.shape[0], a.shape[1]) != tuple(current.shape):
                    raise WeightSyncError(
                        f"adapter module {module!r}: B @ A is {(b.shape[0], a.shape[1])}, "
                        f"the weight is {tuple(current.shape)}"
                    )
                base = self.base.get(name)
                if base is None:
                    base = current.detach().clone()
                delta = (b.float() @ a.float()) * scaling
                out[name] = (base.float() + delta.to(base.device)).to(base.dtype)
            for name, base in self.base.items():
                out.setdefault(name, base)
            for name in out:
                self.base.setdefault(name, weights[name].detach().clone())
        return out

    def forget(self) -> None:
        """Drop the kept originals (after a full weight update the served weights are the base)."""
        self.base.clear()


def save_adapter_dir(
    adapter: Mapping[str, torch.Tensor],
    directory: str | Path,
    *,
    r: int,
    alpha: float,
    target_modules: list[str],
    base_model: str,
) -> Path:
    """Write ``adapter`` as a PEFT adapter directory (``adapter_model.safetensors`` and
    ``adapter_config.json``), the layout vLLM's ``/v1/load_lora_adapter`` reads."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(r),
        "lora_alpha": float(alpha),
        "lora_dropout": 0.0,
        "target_modules": list(target_modules),
        "bias": "none",
        "base_model_name_or_path": base_model,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def load_lora_request(lora_name: str, lora_path: str | Path) -> tuple[str, dict[str, Any]]:
    """vLLM's run-time adapter load: the route and its JSON body. The server must run with
    ``--enable-lora`` (and ``--max-lora-rank`` at least ``r``) and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; clients then generate with ``model=lora_name``.
    ``load_inplace`` replaces an adapter already loaded under the same name (each push).

    >>> route, body = load_lora_request("policy", "/tmp/v000002")
    >>> route, body["lora_name"], body["lora_path"], body["load_inplace"]
    ('/v1/load_lora_adapter', 'policy', '/tmp/v000002', True)
    """
    body = {"lora_name": lora_name, "lora_path": str(lora_path), "load_inplace": True}
    return "/v1/load_lora_adapter", body
