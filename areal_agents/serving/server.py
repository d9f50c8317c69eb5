"""Handles on the built-in server: start it as a subprocess, wait for it, push weights to it.

>>> with BuiltinServer() as server:  # doctest: +SKIP
...     server.wait_ready(timeout=120)
...     client = openai.OpenAI(base_url=server.base_url, api_key="none")
...     server.update_weights_from_disk("checkpoints/step_10", version=10, timeout=60)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

import httpx

from areal_agents.errors import WeightSyncError
from areal_agents.serving.auth import SERVER_API_KEY_ENV, auth_headers, server_api_key
from areal_agents.serving.process import ServerProcess, probe_health, send_request
from areal_agents.serving.weights import state_dict_to_bytes

if TYPE_CHECKING:
    import torch

__all__ = ["BuiltinServer", "BuiltinServerClient"]


class BuiltinServerClient:
    """The training routes of a running built-in server (see
    :class:`~areal_agents.serving.base.InferenceServer`)."""

    status_timeout_s: ClassVar[float] = ServerProcess.status_timeout_s
    """Time limit of a status read (the weight version)."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.root_url = root
        self.api_key = server_api_key(api_key)
        """The server's key, sent on every route (None: ``AREAL_SERVER_API_KEY``, if set)."""

    def _post(self, route: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
        kwargs["headers"] = {**kwargs.get("headers", {}), **auth_headers(self.api_key)}
        response = send_request("POST", self.root_url, route, timeout, **kwargs)
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except Exception:
                message = response.text[:500]
            raise WeightSyncError(f"{route} answered {response.status_code}: {message}")
        data: dict[str, Any] = response.json()
        return data

    def update_weights_from_disk(self, path: str, version: int, timeout: float = 120.0) -> None:
        """Load the safetensors checkpoint directory ``path`` and serve it as ``version``."""
        body = {"path": str(Path(path).resolve()), "version": int(version)}
        self._post("/update_weights_from_disk", timeout, json=body)

    def update_weights_from_state_dict(
        self, state: Mapping[str, torch.Tensor], version: int, timeout: float = 120.0
    ) -> None:
        """Send ``state`` in memory (safetensors bytes in the request body)."""
        data = state_dict_to_bytes(state)
        headers = {"content-type": "application/octet-stream"}
        self._post(
            "/update_weights",
            timeout,
            params={"version": int(version)},
            content=data,
            headers=headers,
        )

    def update_adapter(
        self,
        adapter: Mapping[str, torch.Tensor],
        scaling: float,
        version: int,
        timeout: float = 120.0,
    ) -> None:
        """Send a LoRA ``adapter`` (PEFT names) in memory; the server serves its base weights
        plus ``scaling * B @ A`` as ``version`` (:mod:`areal_agents.serving.adapters`)."""
        data = state_dict_to_bytes(adapter)
        headers = {"content-type": "application/octet-stream"}
        params = {"version": int(version), "scaling": float(scaling)}
        self._post("/update_weights", timeout, params=params, content=data, headers=headers)

    def weight_version(self) -> int:
        try:
            response = httpx.get(
                f"{self.root_url}/weight_version",
                timeout=self.status_timeout_s,
                headers=auth_headers(self.api_key),
            )
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise WeightSyncError(f"/weight_version failed: {e}") from None
        return int(response.json()["weight_version"])

    def pause(self, timeout: float = 60.0) -> None:
        self._post("/pause", timeout)

    def resume(self, timeout: float = 10.0) -> None:
        self._post("/resume", timeout)

    def is_healthy(self) -> bool:
        return probe_health(self.root_url)


class BuiltinServer(BuiltinServerClient, ServerProcess):
    """``python -m areal_agents.serving.serve`` as a child process (on 127.0.0.1 by default).

    Args:
        model: a local HF directory, or ``"default"`` for the offline SmolLM2-135M-Instruct.
        host: the address to bind (loopback unless a cluster needs another).
        port: 0 picks a free port (another one if it is taken before the server binds it).
        served_model_name: the ``model`` clients send (default: the model's directory name, or
            ``SmolLM2-135M-Instruct`` for the default model).
        extra_args: more ``serve`` flags (``["--max-batch-size", "8"]``).
        die_with_parent: end the server when this process dies, even by ``kill -9`` (Linux
            ``PR_SET_PDEATHSIG``, plus the server's own ``--parent-pid`` watch); on by default.
        api_key: guard every route but ``/health`` with this key (default:
            ``AREAL_SERVER_API_KEY``, if set); it reaches the server through its environment,
            never its command line, and this handle's requests carry it.
    """

    display_name = "the built-in server"
    poll_interval_s = 0.25
    log_prefix = "areal-serve-"
    log_tail_on_timeout = False

    def __init__(
        self,
        model: str = "default",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model_name: str | None = None,
        max_model_len: int = 2048,
        device: str = "cpu",
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
        die_with_parent: bool = True,
        api_key: str | None = None,
    ) -> None:
        from areal_agents.serving.model import DEFAULT_MODEL_NAME

        self.die_with_parent = die_with_parent
        self.model = model
        self.served_model_name = served_model_name or (
            DEFAULT_MODEL_NAME if model in ("default", DEFAULT_MODEL_NAME) else Path(model).name
        )
        self.host = host
        self.pick_port(port)
        self.max_model_len = max_model_len
        self.device = device
        self.extra_args = tuple(extra_args)
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        super().__init__(self.base_url, api_key)

    def environment(self) -> dict[str, str]:
        """The inherited environment, with this server's key (or none) as the child's."""
        env = super().environment()
        env.pop(SERVER_API_KEY_ENV, None)
        if self.api_key:
            env[SERVER_API_KEY_ENV] = self.api_key
        return env

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            sys.executable,
            "-m",
            "areal_agents.serving.serve",
            "--model",
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--device",
            self.device,
            *(["--parent-pid", str(os.getpid())] if self.die_with_parent else []),
            *self.extra_args,
        ]
