"""Handles on the built-in server: start it as a subprocess, wait for it, push weights to it.

>>> with BuiltinServer() as server:  # doctest: +SKIP
...     server.wait_ready(timeout=120)
...     client = openai.OpenAI(base_url=server.base_url, api_key="none")
...     server.update_weights_from_disk("checkpoints/step_10", version=10, timeout=60)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import httpx

from areal_agents.errors import EndpointError, WeightSyncError
from areal_agents.policies.weight_sync import state_dict_to_bytes

if TYPE_CHECKING:
    import torch

__all__ = ["BuiltinServer", "BuiltinServerClient", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent thread dies (Linux PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class BuiltinServerClient:
    """The training routes of a running built-in server (a :class:`WeightSync`)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.root_url = root

    def _post(self, route: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
        try:
            response = httpx.post(f"{self.root_url}{route}", timeout=timeout, **kwargs)
        except httpx.TimeoutException:
            raise WeightSyncError(f"{route} did not answer within {timeout:.0f} s") from None
        except httpx.HTTPError as e:
            raise WeightSyncError(f"{route} failed: {type(e).__name__}: {e}") from None
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

    def weight_version(self) -> int:
        try:
            response = httpx.get(f"{self.root_url}/weight_version", timeout=10.0)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise WeightSyncError(f"/weight_version failed: {e}") from None
        return int(response.json()["weight_version"])

    def pause(self, timeout: float = 60.0) -> None:
        self._post("/pause", timeout)

    def resume(self, timeout: float = 10.0) -> None:
        self._post("/resume", timeout)

    def is_healthy(self) -> bool:
        try:
            return httpx.get(f"{self.root_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False


class BuiltinServer(BuiltinServerClient):
    """``python -m areal_agents.policies.serve`` as a child process (on 127.0.0.1 by default).

    Args:
        model: a local HF directory, or ``"default"`` for the offline SmolLM2-135M-Instruct.
        host: the address to bind (loopback unless a cluster needs another).
        port: 0 picks a free port.
        served_model_name: the ``model`` clients send (default: the model's directory name, or
            ``SmolLM2-135M-Instruct`` for the default model).
        extra_args: more ``serve`` flags (``["--max-batch-size", "8"]``).
        die_with_parent: on Linux, kill the server when the thread that called :meth:`start`
            exits (so a ``kill -9`` of a trainer leaves no orphan server); call ``start`` from
            a thread that lives as long as the server, e.g. the main thread.
    """

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
        die_with_parent: bool = False,
    ) -> None:
        from areal_agents.policies.model import DEFAULT_MODEL_NAME

        self.die_with_parent = die_with_parent
        self.model = model
        self.served_model_name = served_model_name or (
            DEFAULT_MODEL_NAME if model in ("default", DEFAULT_MODEL_NAME) else Path(model).name
        )
        self.host = host
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.device = device
        self.extra_args = tuple(extra_args)
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        super().__init__(f"http://{host}:{self.port}/v1")

    def start(self) -> BuiltinServer:
        """Start the server process (returns at once; see :meth:`wait_ready`)."""
        if self.process is not None:
            return self
        command = [
            sys.executable,
            "-m",
            "areal_agents.policies.serve",
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
            *self.extra_args,
        ]
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="areal-serve-", suffix=".log")
            self._log = os.fdopen(fd, "ab")
            self.log_path = Path(name)
        else:
            self._log = self.log_path.open("ab")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        return self

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for error messages)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout: float = 180.0) -> BuiltinServer:
        """Block until ``/health`` answers; raise :class:`EndpointError` if it dies or times out."""
        if self.process is None:
            self.start()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EndpointError(
                    f"the built-in server exited with code {self.process.returncode}:\n"
                    + self.log_tail()
                )
            if self.is_healthy():
                return self
            time.sleep(0.25)
        self.stop()
        raise EndpointError(f"the built-in server was not ready within {timeout:.0f} s")

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the server process (SIGTERM, then SIGKILL)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> BuiltinServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
