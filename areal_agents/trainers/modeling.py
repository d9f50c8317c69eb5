"""Models the learner trains: the policy, an optional value model, and a tiny test model.

``model=default`` is SmolLM2-135M-Instruct converted offline (``serving.model``). ``model=tiny``
is a *randomly initialised* model with the same architecture family (Llama), the same
tokenizer and chat template, but 2 layers of width 128 (~6.6 M parameters, mostly the
embedding): it produces gibberish and exists so that tests of the training machinery (resume,
FSDP equivalence, weight sync) run in seconds. It is saved once, with a fixed seed, next to the
converted default model, so that the inference server can load it like any HF directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from areal_agents.errors import ConfigError
from areal_agents.files import atomic_directory

if TYPE_CHECKING:
    from areal_agents.trainers.model_config import ModelConfig

__all__ = [
    "TINY_MODEL_NAME",
    "ValueModel",
    "check_model_template",
    "load_policy",
    "model_source",
    "node_model_dir",
    "prepare_model_dir",
    "resolve_model_dir",
    "tiny_model_path",
    "with_chat_template",
]

TINY_MODEL_NAME = "tiny-random-smollm2"
_TINY_STAMP = "areal_tiny.json"
_TINY_SHAPE = {  # head_dim 64 as in SmolLM2: vLLM's CPU attention supports no smaller one
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}


def tiny_model_path(seed: int = 0) -> Path:
    """A tiny random Llama with the default model's tokenizer, saved once (see module doc)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from areal_agents.serving.model import cache_root, default_model_path

    target = cache_root() / f"{TINY_MODEL_NAME}-h{_TINY_SHAPE['hidden_size']}-s{seed}"
    if (target / _TINY_STAMP).is_file():
        return target
    source = default_model_path()
    config = AutoConfig.from_pretrained(str(source))
    for key, value in _TINY_SHAPE.items():
        setattr(config, key, value)
    config.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_directory(target, is_complete=lambda p: (p / _TINY_STAMP).is_file()) as work:
        model.save_pretrained(str(work), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(work))
        (work / _TINY_STAMP).write_text(json.dumps({"seed": seed, **_TINY_SHAPE}))
    return target


def resolve_model_dir(name: str) -> Path:
    """The local directory of ``model.name`` (``default``, ``tiny`` or a path)."""
    if name == "tiny":
        return tiny_model_path()
    from areal_agents.serving.model import resolve_model

    resolved = resolve_model(name)
    path = Path(resolved)
    if not path.is_dir():
        raise ConfigError(
            f"model={name}: not a local model directory; use model=default, model=tiny or a path "
            "to a saved Hugging Face model (no model hub is reached at run time)"
        )
    return path


def check_model_template(model: ModelConfig) -> tuple[Path, str]:
    """The model's directory and the chat template ``model.chat_template`` chooses for it,
    checked to be prefix-preserving over a multi-turn tool dialogue (a
    :class:`~areal_agents.errors.ConfigError` naming ``model.chat_template`` otherwise).

    Costs a tokenizer load and a few renderings: the trainer runs it before Ray or a server
    starts (see :mod:`areal_agents.policies.template_check`).
    """
    from transformers import AutoTokenizer

    from areal_agents.policies.template_check import check_chat_template

    model_dir = resolve_model_dir(model.name)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    return model_dir, check_chat_template(tokenizer, model.chat_template, model.name)


def with_chat_template(model_dir: Path, template: str, dest: Path) -> Path:
    """``dest``: ``model_dir`` with ``template`` as its chat template; every other file is a
    symbolic link to the original (nothing is copied, the original is left alone). ``dest`` is
    rebuilt from scratch; it must be readable wherever the model is loaded."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for entry in sorted(model_dir.iterdir()):
        if entry.name in ("chat_template.jinja", "chat_template.json"):
            continue
        if entry.name == "tokenizer_config.json":  # its own template would compete
            config = json.loads(entry.read_text())
            config.pop("chat_template", None)
            (dest / entry.name).write_text(json.dumps(config, indent=2))
            continue
        (dest / entry.name).symlink_to(entry.resolve())
    (dest / "chat_template.jinja").write_text(template)
    return dest


def model_source(model_dir: Path) -> tuple[Path, str | None]:
    """The original model directory behind a :func:`with_chat_template` view, and the view's
    template (``(model_dir, None)`` for a plain directory). What travels to another node: the
    view lives in the run directory, which only the driver's node has."""
    config = model_dir / "config.json"
    jinja = model_dir / "chat_template.jinja"
    if config.is_symlink() and jinja.is_file():
        return config.resolve().parent, jinja.read_text()
    return model_dir, None


def node_model_dir(model_dir: str | Path, chat_template: str | None) -> Path:
    """``model_dir`` as this node sees it: with ``chat_template`` set, a view of it with that
    template in this node's temporary directory (built once per model and template)."""
    if chat_template is None:
        return Path(model_dir)
    import hashlib
    import tempfile

    key = hashlib.sha256(f"{Path(model_dir).resolve()}\0{chat_template}".encode()).hexdigest()
    target = Path(tempfile.gettempdir()) / f"areal-model-{key[:16]}"
    if not (target / "chat_template.jinja").is_file():
        with atomic_directory(
            target, is_complete=lambda p: (p / "chat_template.jinja").is_file()
        ) as work:
            with_chat_template(Path(model_dir), chat_template, work)
    return target


def prepare_model_dir(model: ModelConfig, run_dir: Path) -> Path:
    """The model directory a run uses: checked by :func:`check_model_template`, and, when
    ``model.chat_template`` is set, seen through ``<run>/model`` with that template, so that
    the servers, the rollout clients and the learner all render with it."""
    model_dir, template = check_model_template(model)
    if model.chat_template is None:
        return model_dir
    return with_chat_template(model_dir, template, run_dir / "model")


def load_policy(path: Path, dtype: str = "float32", gradient_checkpointing: bool = False) -> Any:
    """The causal LM at ``path`` in training mode (dropout off: logprobs must be reproducible)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    _no_dropout(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()
    return model


class ValueModel(nn.Module):
    """A critic: the policy's backbone (a separate copy) with a scalar head on every token."""

    def __init__(self, path: Path, dtype: str = "float32") -> None:
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(str(path), dtype=getattr(torch, dtype))
        _no_dropout(self.backbone)
        hidden = int(self.backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1, dtype=getattr(torch, dtype))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None
    ) -> Tensor:
        """Values ``[B, T]``: ``V(prefix up to and including token t)`` (``attention_mask``
        ``[B, T]``, or a 4-D mask with ``position_ids`` for a packed sequence)."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )
        return self.head(hidden.last_hidden_state).squeeze(-1).clone()  # [B, T], not a view

    @property
    def layers(self) -> list[nn.Module]:
        return list(getattr(self.backbone, "layers", []))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (what FSDP shards one by one)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def _no_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "dropout"):
        if config is not None and hasattr(config, key):
            setattr(config, key, 0.0)
