"""Inference servers for training, and the weight push that follows every optimizer step.

Servers come from the engine registry (``inference.engine``: the built-in server or the vLLM
launcher, :mod:`areal_agents.serving.engines`) and implement
:class:`~areal_agents.serving.base.InferenceServer`. On a local Ray instance the driver starts
them as child processes bound to 127.0.0.1; attached to a cluster (``ray.address=...``) each
server is started inside a Ray actor that reserves ``inference.gpus_per_server`` GPUs, so Ray
places it on a GPU node, the servers spread over the nodes in turn.
``inference.torch_threads`` sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in each server's
environment (a built-in server reports the count it runs with on ``/health``).

:class:`WeightSync` pushes version ``v`` to every server with a time limit: the learner writes a
safetensors directory (``weight_sync=disk``), hands over its state dict
(``weight_sync=state_dict``) or leaves it in Ray's object store for the server's node to load
(``weight_sync=object_store``, :mod:`areal_agents.trainers.object_store`), or, with vLLM,
the learner ranks send it through vLLM's own weight transfer (``weight_sync=nccl|ipc``,
:mod:`areal_agents.serving.vllm_transfer`: the servers are paused, rank 0 broadcasts, each
server's ``/finish_weight_update`` sets the version; no disk involved); a server that
fails or does not answer in time raises :class:`~areal_agents.errors.WeightSyncError`, never a
silent hang. The servers interrupt the generations in flight, swap the weights and continue
them, tagging new tokens with ``v``.
With ``model.lora.r > 0`` a push sends only the LoRA adapter; each server merges it onto the
base weights it keeps (:mod:`areal_agents.serving.adapters`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from areal_agents.errors import WeightSyncError
from areal_agents.serving.base import InferenceServer
from areal_agents.serving.engines import get_engine
from areal_agents.trainers.cluster import spread
from areal_agents.trainers.config import InferenceConfig, LoraConfig
from areal_agents.trainers.object_store import ShmLoader
from areal_agents.trainers.runtime import remote_class

__all__ = [
    "WeightSync",
    "launch_local_servers",
    "server_torch_threads",
    "start_servers",
    "stop_servers",
    "thread_env",
]

logger = logging.getLogger(__name__)

VLLM_TRANSFER = ("nccl", "ipc")
"""``weight_sync`` modes that are vLLM's own weight transfer, driven from the learner ranks."""


def _create(
    cfg: InferenceConfig, model_dir: str, name: str, host: str, log_path: Path | None
) -> Any:
    """A server handle, not started yet."""
    extra_args = list(cfg.extra_args)
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
            self._call("stop", wait_s=60)
        finally:
            self._ray.kill(self.handle)


def start_servers(
    cfg: InferenceConfig,
    model_dir: Path,
    served_name: str,
    *,
    on_cluster: bool,
    log_dir: Path | None = None,
    launched: list[InferenceServer] | None = None,
    chat_template: str | None = None,
) -> list[InferenceServer]:
    """Start ``cfg.num_servers`` servers on ``model_dir`` and wait until they answer
    (``launched``: local servers :func:`launch_local_servers` already started, to wait for).
    On a cluster each server applies ``chat_template`` to ``model_dir`` on its own node."""
    if not on_cluster:
        servers = launched or launch_local_servers(cfg, model_dir, served_name, log_dir)
        try:
            with concurrent.futures.ThreadPoolExecutor(cfg.num_servers) as pool:
                list(pool.map(lambda s: s.wait_ready(timeout=cfg.startup_timeout_s), servers))
        except BaseException:
            stop_servers(servers)
            raise
        return servers

    host = remote_class(_ServerHost)
    handles = [
        host.options(
            num_cpus=0, num_gpus=cfg.gpus_per_server, **spread(True, i, 0.0, cfg.gpus_per_server)
        ).remote(cfg=cfg, model_dir=str(model_dir), name=served_name, chat_template=chat_template)
        for i in range(cfg.num_servers)
    ]
    return [_RemoteServer(h) for h in handles]


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


def _adapter_push(server: InferenceServer, scaling: float) -> Callable[..., None]:
    """``server``'s LoRA adapter update as ``fn(adapter, version, timeout)``."""
    update = getattr(server, "update_adapter", None)
    if update is None:
        raise WeightSyncError(f"the server at {server.base_url} takes no LoRA adapter push")

    def push(adapter: Mapping[str, Any], version: int, timeout: float) -> None:
        update(adapter, scaling, version, timeout)

    return push


_Call = tuple[Callable[..., None], Any]


def _pause_all(servers: list[InferenceServer]) -> None:
    """Stop generating on every server (in-flight requests end with ``finish_reason=abort``;
    the token client continues them under the new weights)."""
    for server in servers:
        server.pause()


def _resume_all(servers: list[InferenceServer]) -> None:
    errors = []
    for server in servers:
        try:
            server.resume()
        except Exception as e:  # resume the others all the same
            errors.append(e)
    if errors:
        raise WeightSyncError(f"resuming after a weight update failed: {errors[0]}")


class WeightSync:
    """Pushes each new version from the learners to every server, with a time limit.

    The one thing called ``WeightSync``: the trainer's push. What a server must offer for it
    is :class:`~areal_agents.serving.base.InferenceServer`.
    """

    def __init__(
        self,
        cfg: InferenceConfig,
        servers: list[InferenceServer],
        weights_dir: Path,
        lora: LoraConfig | None = None,
        *,
        on_cluster: bool = False,
    ) -> None:
        self.cfg = cfg
        self.mode = cfg.resolved_weight_sync(on_cluster)
        self.lora = lora if lora is not None and lora.enabled else None
        """With LoRA on, each push sends only the adapter (the servers keep the base)."""
        self.servers = servers
        self.weights_dir = weights_dir
        self.last_push_s = 0.0
        self.served_versions: list[int] = []
        #: extra seconds granted beyond the servers' own timeout before giving up on them
        self.grace_s = 60.0
        self._transfer_ready = False
        self._loader: ShmLoader | None = None  # object_store: the staged file of local servers
        if self.mode not in self._MODES:
            raise WeightSyncError(f"unknown inference.weight_sync={self.mode!r}")

    # ---- how each mode gets the weights to the servers: ``fn(learners, version) -> calls``,
    # one ``(update, argument)`` per server, run as ``update(argument, version, timeout)``

    def _adapter_calls(self, learners: Any, version: int) -> list[_Call]:
        """The LoRA adapter only, merged by each server onto its base."""
        assert self.lora is not None
        adapter, scaling = learners.adapter_state(), self.lora.scaling
        return [(_adapter_push(s, scaling), adapter) for s in self.servers]

    def _disk_calls(self, learners: Any, version: int) -> list[_Call]:
        target = self.weights_dir / f"v{version:06d}"
        learners.export_weights(target)
        return [(s.update_weights_from_disk, str(target)) for s in self.servers]

    def _object_store_calls(self, learners: Any, version: int) -> list[_Call]:
        """The weights are staged on each server's node: by the host actor of a server on a
        cluster node (one staged file per server), here for all the servers this process
        started (one file for them all)."""
        refs = [learners.state_ref()]  # in a list: Ray passes it on unresolved
        hosted = [s for s in self.servers if hasattr(s, "update_weights_from_ref")]
        calls: list[_Call] = [(s.update_weights_from_ref, refs) for s in hosted]
        local = [s for s in self.servers if not hasattr(s, "update_weights_from_ref")]
        if local:
            if self._loader is None:
                self._loader = ShmLoader()
            calls.append((functools.partial(self._loader.load, local), refs))
        return calls

    def _state_dict_calls(self, learners: Any, version: int) -> list[_Call]:
        state = learners.full_state()
        return [(s.update_weights_from_state_dict, state) for s in self.servers]

    def _vllm_transfer_calls(self, learners: Any, version: int) -> list[_Call]:
        """vLLM's own transfer: the learner ranks send; one call for all servers."""

        def send(_: None, version: int, timeout: float) -> None:
            if not self._transfer_ready:  # the rendezvous, once
                urls = [str(s.base_url) for s in self.servers]
                learners.init_vllm_transfer(
                    backend=self.mode,
                    base_urls=urls,
                    timeout_s=timeout,
                    bucket_bytes=int(self.cfg.weight_bucket_mb * (1 << 20)),
                )
                self._transfer_ready = True
            _pause_all(self.servers)
            try:
                learners.send_vllm_weights(version)
            finally:
                _resume_all(self.servers)

        return [(send, None)]

    _MODES: ClassVar[dict[str, Callable[[WeightSync, Any, int], list[_Call]]]] = {
        "disk": _disk_calls,
        "object_store": _object_store_calls,
        "state_dict": _state_dict_calls,
        "nccl": _vllm_transfer_calls,
        "ipc": _vllm_transfer_calls,
    }

    def push(self, learners: Any, version: int) -> float:
        """Send version ``version`` to every server; returns the seconds it took."""
        start = time.perf_counter()
        timeout = self.cfg.weight_sync_timeout_s
        if self.lora is not None:
            calls = self._adapter_calls(learners, version)
        else:
            calls = self._MODES[self.mode](self, learners, version)
        pool = concurrent.futures.ThreadPoolExecutor(len(calls), thread_name_prefix="push")
        try:
            futures = [pool.submit(fn, arg, version, timeout) for fn, arg in calls]
            done, pending = concurrent.futures.wait(futures, timeout=timeout + self.grace_s)
            if pending:
                raise WeightSyncError(
                    f"weight version {version}: {len(pending)} server(s) did not answer within "
                    f"{timeout}s (inference.weight_sync_timeout_s)"
                )
            for f in done:
                error = f.exception()
                if error is not None:
                    if isinstance(error, WeightSyncError):
                        raise error
                    raise WeightSyncError(f"weight version {version}: {error}") from error
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # never wait on a stuck server
        served = [int(s.weight_version()) for s in self.servers]
        if any(v != version for v in served):
            raise WeightSyncError(f"pushed weight version {version} but the servers serve {served}")
        self.served_versions = served
        if self.mode == "disk" and self.lora is None:
            for old in self.weights_dir.glob("v*"):
                if old.name != f"v{version:06d}":
                    shutil.rmtree(old, ignore_errors=True)
        self.last_push_s = time.perf_counter() - start
        return self.last_push_s

    def close(self) -> None:
        """Release what the pushes keep between them (the staged file of ``object_store``)."""
        if self._loader is not None:
            self._loader.close()
            self._loader = None
