"""Inference servers for training: started locally or on a cluster, stopped with the run.

Servers come from the engine registry (``inference.engine``: the built-in server or the vLLM
launcher, :mod:`areal_agents.serving.engines`) and implement
:class:`~areal_agents.serving.base.InferenceServer`. On a local Ray instance the driver starts
them as child processes bound to 127.0.0.1; attached to a cluster (``ray.address=...``) each
server is started inside a Ray actor in the server's bundle of the run's placement group
(``inference.gpus_per_server`` GPUs, ``ray.actor_cpus`` CPUs: ``trainers/placement.py``).
:func:`server_alive` tells whether a server's process still runs; :func:`start_server` starts
one again in its slot (the run's supervision, ``trainers/supervisor.py``).
``inference.torch_threads`` sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in each server's
environment (a built-in server reports the count it runs with on ``/health``).

The weight push after every optimizer step is
:class:`~areal_agents.trainers.weight_sync.WeightSync`.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal_agents.errors import WeightSyncError
from areal_agents.serving.base import TRAINING_LOGPROBS_MODE, InferenceServer
from areal_agents.serving.engines import get_engine
from areal_agents.trainers.config import InferenceConfig
from areal_agents.trainers.object_store import ShmLoader
from areal_agents.trainers.placement import Placement
from areal_agents.trainers.runtime import remote_class
from areal_agents.trainers.weight_sync import VLLM_TRANSFER

__all__ = [
    "launch_local_servers",
    "server_alive",
    "server_torch_threads",
    "start_server",
    "start_servers",
    "stop_servers",
    "thread_env",
]

logger = logging.getLogger(__name__)


def _create(
    cfg: InferenceConfig, model_dir: str, name: str, host: str, log_path: Path | None
) -> Any:
    """A server handle, not started yet."""
    extra_args = list(cfg.extra_args)
    if not any(a.split("=")[0] == "--logprobs-mode" for a in extra_args):
        # behaviour log-probs are the sampling distribution's (at inference.temperature), as
        # the learner computes its own: raw ones would skew every importance weight at T != 1
        extra_args += ["--logprobs-mode", TRAINING_LOGPROBS_MODE]
    if cfg.weight_sync in VLLM_TRANSFER:  # vLLM's own weight transfer, set up at launch
        extra_args += ["--weight-transfer-config", json.dumps({"backend": cfg.weight_sync})]
    kwargs: dict[str, Any] = {
        "served_model_name": name,
        "host": host,
        "extra_args": extra_args,
        "log_path": log_path,
    }
    # the launchers end their server with this process (die_with_parent, on by default)
    server = get_engine(cfg.engine).server_class()(model_dir, **kwargs)
    server.extra_env = thread_env(cfg)
    server.cpus = cfg.cpus
    if cfg.weight_sync == "ipc":  # CUDA IPC handles arrive pickled (a colocated, local server)
        server.extra_env = {**server.extra_env, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    return server


def thread_env(cfg: InferenceConfig) -> dict[str, str]:
    """``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for ``inference.torch_threads`` (empty: None)."""
    if cfg.torch_threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(cfg.torch_threads), "MKL_NUM_THREADS": str(cfg.torch_threads)}


def server_torch_threads(servers: list[InferenceServer]) -> list[int | None]:
    """Torch threads each server reports on ``/health`` (None where it reports none: vLLM)."""
    import httpx

    out: list[int | None] = []
    for server in servers:
        root = str(server.base_url).removesuffix("/v1")
        try:
            value = httpx.get(f"{root}/health", timeout=5.0).json().get("torch_threads")
        except (httpx.HTTPError, ValueError, AttributeError):
            value = None
        out.append(int(value) if isinstance(value, int) else None)
    return out


def _launch(cfg: InferenceConfig, model_dir: str, name: str, host: str) -> Any:
    server = _create(cfg, model_dir, name, host, None)
    server.start()
    server.wait_ready(timeout=cfg.startup_timeout_s)
    return server


class _ServerHost:
    """A server started inside a Ray actor (cluster mode): Ray decides the node and GPUs."""

    def __init__(
        self, cfg: InferenceConfig, model_dir: str, name: str, chat_template: str | None = None
    ) -> None:
        import ray

        from areal_agents.trainers.modeling import node_model_dir

        local = str(node_model_dir(model_dir, chat_template))  # never the driver's run dir
        self.server = _launch(cfg, local, name, ray.util.get_node_ip_address())
        self.loader: ShmLoader | None = None  # weight_sync=object_store, on first use

    def base_url(self) -> str:
        return str(self.server.base_url)

    def wait_exit(self, poll_s: float = 0.5) -> int | None:
        """Return once the server's process has ended (its exit status): the trainer keeps
        one call of this in flight to learn of a death (the actor's own shows as an error)."""
        import time

        while (process := self.server.process) is not None and process.poll() is None:
            time.sleep(poll_s)
        return None if process is None else process.returncode

    def call(self, method: str, **kwargs: Any) -> Any:
        return getattr(self.server, method)(**kwargs)

    def load_ref(self, refs: list[Any], version: int, timeout: float) -> None:
        if self.loader is None:
            self.loader = ShmLoader()
        self.loader.load([self.server], refs, version, timeout)  # resolved on this node

    def stop(self) -> None:
        if self.loader is not None:
            self.loader.close()  # the staged weights in this node's shared memory
        self.server.stop()


class _RemoteServer:
    """The driver-side face of a :class:`_ServerHost` actor."""

    def __init__(self, handle: Any) -> None:
        import ray

        self._ray = ray
        self.handle = handle
        self.base_url = str(ray.get(handle.base_url.remote()))
        self._exit = handle.wait_exit.remote()  # ready once the server or its host is gone

    def alive(self) -> bool:
        """Whether the server's process and its host actor still run."""
        ready, _ = self._ray.wait([self._exit], timeout=0)
        return not ready

    def _call(self, method: str, wait_s: float, **kwargs: Any) -> Any:
        if method in ("load_ref", "stop"):  # the host's own methods
            ref = getattr(self.handle, method).remote(**kwargs)
        else:
            ref = self.handle.call.remote(method=method, **kwargs)
        try:
            return self._ray.get(ref, timeout=wait_s)
        except self._ray.exceptions.GetTimeoutError:
            where = self.base_url
            raise WeightSyncError(f"{method} on {where} timed out after {wait_s}s") from None

    def update_weights_from_disk(self, path: str, version: int, timeout: float) -> None:
        self._call(
            "update_weights_from_disk", timeout + 30, path=path, version=version, timeout=timeout
        )

    def update_weights_from_state_dict(
        self, state: Mapping[str, Any], version: int, timeout: float
    ) -> None:
        self._call(
            "update_weights_from_state_dict",
            timeout + 30,
            state=state,
            version=version,
            timeout=timeout,
        )

    def update_adapter(
        self, adapter: Mapping[str, Any], scaling: float, version: int, timeout: float
    ) -> None:
        self._call(
            "update_adapter",
            timeout + 30,
            adapter=adapter,
            scaling=scaling,
            version=version,
            timeout=timeout,
        )

    def update_weights_from_ref(self, refs: list[Any], version: int, timeout: float) -> None:
        self._call("load_ref", timeout + 30, refs=refs, version=version, timeout=timeout)

    def weight_version(self) -> int:
        return int(self._call("weight_version", wait_s=60))

    def pause(self) -> None:
        self._call("pause", wait_s=90)

    def resume(self) -> None:
        self._call("resume", wait_s=60)

    def stop(self) -> None:
        try:
            if self.alive():
                self._call("stop", wait_s=60)
        finally:
            self._ray.kill(self.handle)


def start_servers(
    cfg: InferenceConfig,
    model_dir: Path,
    served_name: str,
    *,
    placement: Placement | None = None,
    log_dir: Path | None = None,
    launched: list[InferenceServer] | None = None,
    chat_template: str | None = None,
) -> list[InferenceServer]:
    """Start ``cfg.num_servers`` servers on ``model_dir`` and wait until they answer
    (``launched``: local servers :func:`launch_local_servers` already started, to wait for).
    With ``placement`` (on a cluster) each server runs in a Ray actor in its bundle and applies
    ``chat_template`` to ``model_dir`` on its own node."""
    if placement is None:
        servers = launched or launch_local_servers(cfg, model_dir, served_name, log_dir)
        try:
            with concurrent.futures.ThreadPoolExecutor(cfg.num_servers) as pool:
                list(pool.map(lambda s: s.wait_ready(timeout=cfg.startup_timeout_s), servers))
        except BaseException:
            stop_servers(servers)
            raise
        return servers
    handles = [
        _host(cfg, model_dir, served_name, placement, i, chat_template)
        for i in range(cfg.num_servers)
    ]
    return [_RemoteServer(h) for h in handles]


def _host(
    cfg: InferenceConfig,
    model_dir: Path,
    served_name: str,
    placement: Placement,
    index: int,
    chat_template: str | None,
) -> Any:
    # two threads: one waits for the server's exit (the trainer's watch), one serves calls
    return (
        remote_class(_ServerHost)
        .options(max_concurrency=2, **placement.options("server", index))
        .remote(cfg=cfg, model_dir=str(model_dir), name=served_name, chat_template=chat_template)
    )


def start_server(
    cfg: InferenceConfig,
    model_dir: Path,
    served_name: str,
    index: int,
    *,
    placement: Placement | None = None,
    log_dir: Path | None = None,
    chat_template: str | None = None,
) -> InferenceServer:
    """Server ``index`` (again, after a death), ready: locally a child process that logs to
    ``server-<index>.log``; with ``placement``, a Ray actor in the server's bundle."""
    if placement is not None:
        return _RemoteServer(_host(cfg, model_dir, served_name, placement, index, chat_template))
    log = None if log_dir is None else log_dir / f"server-{index}.log"
    server = _create(cfg, str(model_dir), served_name, "127.0.0.1", log)
    try:
        server.start()
        server.wait_ready(timeout=cfg.startup_timeout_s)
    except BaseException:
        stop_servers([server])
        raise
    return server


def server_alive(server: InferenceServer) -> bool:
    """Whether ``server`` still runs: its host actor and process on a cluster, its child
    process locally (a stopped one does not; a server given by URL only is taken to run)."""
    alive = getattr(server, "alive", None)
    if alive is not None:
        return bool(alive())
    if not hasattr(server, "process"):
        return True
    process = server.process  # None: stopped (or never started)
    return process is not None and process.poll() is None


def launch_local_servers(
    cfg: InferenceConfig, model_dir: Path, served_name: str, log_dir: Path | None = None
) -> list[InferenceServer]:
    """Start the processes of ``cfg.num_servers`` local servers without waiting for them (they
    load the model while Ray starts); :func:`start_servers` waits."""
    servers: list[InferenceServer] = []
    try:
        for i in range(cfg.num_servers):  # started from this (the main) thread: see _create
            if log_dir is not None:
                log_dir.mkdir(parents=True, exist_ok=True)
            log = None if log_dir is None else log_dir / f"server-{i}.log"
            server = _create(cfg, str(model_dir), served_name, "127.0.0.1", log)
            servers.append(server)
            server.start()
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: list[InferenceServer]) -> None:
    for server in servers:
        try:
            server.stop()
        except Exception:
            logger.warning("stopping an inference server failed", exc_info=True)
