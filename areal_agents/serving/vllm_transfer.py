"""vLLM's native weight transfer (``inference.weight_sync=nccl`` or ``ipc``), driven with timeouts.

vLLM (server started with ``--weight-transfer-config '{"backend": "nccl"}'`` and
``VLLM_SERVER_DEV_MODE=1``) takes weights in four phases, each a route of its server:

1. ``POST /init_weight_transfer_engine`` ``{"init_info": {...}}`` — once: the backend's
   rendezvous (``nccl``: ``master_address``, ``master_port``, ``rank_offset``, ``world_size``,
   ``packed``...; ``ipc``: ``packed``).
2. ``POST /start_weight_update`` — per version.
3. ``POST /update_weights`` ``{"update_info": {"names", "dtype_names", "shapes", ...}}`` — returns
   once the engine has received the tensors, which the trainer sends meanwhile (NCCL broadcast,
   or CUDA IPC handles in ``update_info``).
4. ``POST /finish_weight_update`` ``{"weight_version": "N"}`` — post-processing, and the
   version the server tags new tokens with.

The data plane is vLLM's own trainer-side engine (``vllm.distributed.weight_transfer``:
``WeightTransferTrainerFactory.trainer_init`` with ``NCCLTrainerInitInfo`` or
``IPCTrainerInitInfo``, then ``send_weights()``), which drives those routes through a client
object. This module supplies that client and bounds everything with time limits:

* :class:`WeightTransferClient` — one server's routes (vLLM's ``VLLMWeightSyncClient``
  protocol), each call bounded by its phase's timeout, failures raised as
  :class:`~areal_agents.errors.WeightSyncError` naming the phase, the server and what to check.
* :class:`FanOutClient` — several servers as one: every call goes to all of them at once, and
  the NCCL rendezvous puts each server's workers at their own ``rank_offset`` in one group with
  the trainer (rank 0), so one broadcast reaches them all.
* :class:`TrainerTransfer` — one learner rank's side: :meth:`~TrainerTransfer.init` (the
  rendezvous) and :meth:`~TrainerTransfer.send` (one version) run vLLM's engine in a helper
  thread and give up with :class:`WeightSyncError` at the phase deadline, or as soon as a server
  call failed, instead of waiting on a collective whose peer is gone.

Tensors travel in buckets: vLLM packs them into buffers of ``bucket_bytes`` (its
``packed_buffer_size_bytes``), so neither side holds more than a few buckets at once. Only the
control plane has run here (against a fake server and the CPU build of vLLM, whose NCCL
rendezvous fails without GPUs); the data plane needs GPUs.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from areal_agents.errors import WeightSyncError
from areal_agents.serving.auth import auth_headers

__all__ = [
    "FanOutClient",
    "PhaseTimeouts",
    "TrainerTransfer",
    "WeightTransferClient",
    "module_transfer",
    "server_world_size",
]

Backend = Literal["nccl", "ipc"]


@dataclass(frozen=True)
class PhaseTimeouts:
    """Seconds each phase of a weight transfer may take before :class:`WeightSyncError`."""

    init_s: float = 300.0
    """``/init_weight_transfer_engine`` (a rendezvous: the trainer and every server join)."""
    start_s: float = 60.0
    """``/start_weight_update``."""
    update_s: float = 300.0
    """``/update_weights``: every bucket of one version, with the trainer's sends."""
    finish_s: float = 120.0
    """``/finish_weight_update``."""

    @classmethod
    def within(cls, total_s: float) -> PhaseTimeouts:
        """Phase limits for a push that must end within ``total_s`` (init gets as much)."""
        return cls(init_s=total_s, start_s=total_s / 6, update_s=total_s / 2, finish_s=total_s / 3)


def server_world_size(base_url: str, timeout: float = 30.0) -> int:
    """How many workers a vLLM server runs (``/get_world_size``: TP x PP x DP)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        response = httpx.get(f"{root}/get_world_size", timeout=timeout, headers=auth_headers())
        response.raise_for_status()
        return int(response.json()["world_size"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise WeightSyncError(
            f"init: could not read the world size of {root} (/get_world_size): {e}; start vLLM "
            "with VLLM_SERVER_DEV_MODE=1"
        ) from None


def _json_safe(update_info: Mapping[str, Any]) -> dict[str, Any]:
    """``update_info`` as JSON: CUDA IPC handles (tuples of objects) travel pickled and base64
    encoded as ``ipc_handles_pickled``, which vLLM's worker reads when started with
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (as vLLM's own HTTP client sends them)."""
    out = dict(update_info)
    handles = out.pop("ipc_handles", None)
    if handles is not None:
        import base64
        import pickle

        out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
    return out


class WeightTransferClient:
    """One vLLM server's weight-transfer routes, each call bounded by its phase's timeout.

    Implements vLLM's ``VLLMWeightSyncClient`` protocol, so vLLM's trainer engines drive it.
    """

    def __init__(
        self, base_url: str, timeouts: PhaseTimeouts | None = None, api_key: str | None = None
    ) -> None:
        self.root_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeouts = timeouts or PhaseTimeouts()
        self.headers = auth_headers(api_key)  # the server's key (AREAL_SERVER_API_KEY)

    def _post(self, phase: str, route: str, timeout: float, body: Any = None) -> None:
        try:
            response = httpx.post(
                f"{self.root_url}{route}", json=body, timeout=timeout, headers=self.headers
            )
        except httpx.TimeoutException:
            raise WeightSyncError(
                f"{phase} ({route}) on {self.root_url}: no answer within {timeout:g}s; check "
                "that every trainer rank joined and the server's log for a stuck collective"
            ) from None
        except httpx.HTTPError as e:
            raise WeightSyncError(f"{phase} ({route}) on {self.root_url} failed: {e}") from None
        if response.status_code == 404:
            raise WeightSyncError(
                f"{phase}: {self.root_url} has no {route} route; start vLLM (0.16 or later) with "
                'VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config \'{"backend": "nccl"}\''
            )
        if response.status_code >= 400:
            raise WeightSyncError(
                f"{phase} ({route}) on {self.root_url}: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )

    def init_weight_transfer_engine(self, init_info: Mapping[str, Any]) -> None:
        """Phase 1: the backend's rendezvous (once)."""
        body = {"init_info": dict(init_info)}
        self._post("init", "/init_weight_transfer_engine", self.timeouts.init_s, body)

    def start_weight_update(self) -> None:
        """Phase 2: the server prepares for a new version."""
        self._post("start", "/start_weight_update", self.timeouts.start_s)

    def update_weights(self, update_info: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Phase 3: returns when the server has received the tensors ``update_info`` names."""
        if isinstance(update_info, Mapping):
            info: Any = _json_safe(update_info)
        else:
            info = [_json_safe(i) for i in update_info]
        self._post("update", "/update_weights", self.timeouts.update_s, {"update_info": info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Phase 4: post-processing; the server serves ``weight_version`` from now on."""
        body = None if weight_version is None else {"weight_version": str(weight_version)}
        self._post("finish", "/finish_weight_update", self.timeouts.finish_s, body)

    def shutdown_weight_transfer_engine(self) -> None:
        """Release the server's side of the transfer (its communicator)."""
        self._post("shutdown", "/shutdown_weight_transfer_engine", self.timeouts.finish_s)


class FanOutClient:
    """Several servers as one ``VLLMWeightSyncClient``: each call runs on all at once.

    Args:
        clients: one client per server.
        world_sizes: each server's worker count (:func:`server_world_size`); server ``i``'s
            workers join the NCCL group at ``rank_offset = 1 + sum(world_sizes[:i])``.

    Set :attr:`version` before a push: vLLM's engines call ``finish_weight_update()`` without
    one, and this client adds it. :attr:`failed` is set when any call failed, so a waiter can
    stop waiting on a data-plane collective that will never complete.
    """

    def __init__(self, clients: Sequence[WeightTransferClient], world_sizes: Sequence[int]):
        if len(clients) != len(world_sizes) or not clients:
            raise ValueError("one world size per client, and at least one client")
        self.clients = list(clients)
        self.world_sizes = [int(w) for w in world_sizes]
        self.version: int | None = None
        self.failed = threading.Event()
        self.error: BaseException | None = None

    @property
    def world_size(self) -> int:
        """The NCCL group: the trainer's sender and every server's workers."""
        return 1 + sum(self.world_sizes)

    def _each(self, call: Callable[[WeightTransferClient, int], None]) -> None:
        try:
            with concurrent.futures.ThreadPoolExecutor(len(self.clients)) as pool:
                futures = [pool.submit(call, c, i) for i, c in enumerate(self.clients)]
                for future in futures:
                    future.result()
        except BaseException as e:
            self.error = self.error or e
            self.failed.set()
            raise

    def init_weight_transfer_engine(self, init_info: Mapping[str, Any]) -> None:
        offsets = [1 + sum(self.world_sizes[:i]) for i in range(len(self.clients))]

        def init(client: WeightTransferClient, i: int) -> None:
            info = dict(init_info)
            if "rank_offset" in info:  # NCCL: each server's workers after the previous ones
                info.update(rank_offset=offsets[i], world_size=self.world_size)
            client.init_weight_transfer_engine(info)

        self._each(init)

    def start_weight_update(self) -> None:
        self._each(lambda c, _: c.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._each(lambda c, _: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.version
        self._each(lambda c, _: c.finish_weight_update(None if version is None else str(version)))

    def shutdown_weight_transfer_engine(self) -> None:
        self._each(lambda c, _: c.shutdown_weight_transfer_engine())


def _run_bounded(what: str, fn: Callable[[], Any], deadline_s: float, client: FanOutClient) -> Any:
    """``fn()`` in a daemon thread; :class:`WeightSyncError` if it fails, soon after a server
    call failed (``client.failed``), or when ``deadline_s`` passes. A thread stuck in a
    collective is left behind (daemon): the transfer group is unusable then, and the run fails."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name=f"weight-transfer-{what}", daemon=True).start()
    deadline = time.monotonic() + deadline_s
    while not done.wait(0.05):
        if client.failed.is_set():  # the data plane may wait forever for that server
            done.wait(1.0)
            break
        if time.monotonic() > deadline:
            raise WeightSyncError(
                f"{what}: vLLM's weight transfer did not finish within {deadline_s:g}s; check "
                "every server's log and that the trainer and the servers reach each other"
            )
    error = outcome.get("error") or (None if done.is_set() else client.error)
    if error is not None:
        if isinstance(error, WeightSyncError):
            raise error
        raise WeightSyncError(f"{what}: {type(error).__name__}: {error}") from error
    return outcome.get("value")


class TrainerTransfer:
    """One learner rank's side of vLLM's weight transfer (every rank makes one).

    Rank 0 is the sender: it drives the servers' routes and sends the tensors; the other ranks
    take part in gathering each (FSDP-sharded) tensor, as vLLM's engines expect.

    Args:
        backend: ``nccl`` (servers anywhere the trainer reaches) or ``ipc`` (a server on the
            same GPU as the trainer).
        base_urls: the servers (only rank 0 calls them).
        rank: this learner rank.
        source: a ``vllm.distributed.weight_transfer.WeightSource`` (e.g. ``ModuleSource`` over
            the FSDP-sharded model).
        timeouts: per-phase limits.
        bucket_bytes: the size of one packed bucket.
        master_address, master_port: where the NCCL group meets (this rank's host, a free port).
        world_sizes: each server's worker count (default: asked of each server).
    """

    def __init__(
        self,
        backend: Backend,
        base_urls: Sequence[str],
        rank: int,
        source: Any,
        *,
        timeouts: PhaseTimeouts | None = None,
        bucket_bytes: int = 256 << 20,
        master_address: str = "127.0.0.1",
        master_port: int = 0,
        world_sizes: Sequence[int] | None = None,
    ) -> None:
        if backend not in ("nccl", "ipc"):
            raise ValueError(f"backend={backend!r}: nccl or ipc")
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes={bucket_bytes}: must be positive")
        self.backend = backend
        self.rank = rank
        self.source = source
        self.timeouts = timeouts or PhaseTimeouts()
        self.bucket_bytes = bucket_bytes
        self.master_address = master_address
        self.master_port = master_port
        clients = [WeightTransferClient(u, self.timeouts) for u in base_urls]
        if world_sizes is None:
            world_sizes = (
                [server_world_size(u) for u in base_urls] if rank == 0 else [1] * len(clients)
            )
        self.client = FanOutClient(clients, world_sizes)
        self.engine: Any = None

    def init_info(self) -> Any:
        """vLLM's trainer-side init info for this rank (imports vLLM)."""
        if self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            return NCCLTrainerInitInfo(
                master_address=self.master_address,
                master_port=self.master_port,
                world_size=self.client.world_size,
                packed=True,
                packed_buffer_size_bytes=self.bucket_bytes,
                rank=self.rank,
            )
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(
            packed=True, packed_buffer_size_bytes=self.bucket_bytes, rank=self.rank
        )

    def init(self) -> None:
        """The rendezvous with every server (once, on every rank, before the first push)."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        info = self.init_info()

        def init() -> Any:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=self.client, source=self.source
            )

        self.client.failed.clear()
        self.engine = _run_bounded("init", init, self.timeouts.init_s, self.client)

    def send(self, version: int) -> None:
        """Send the source's tensors to every server as ``version`` (on every rank)."""
        if self.engine is None:
            raise WeightSyncError("the weight transfer was not initialised (call init first)")
        self.client.version = int(version)
        self.client.failed.clear()
        t = self.timeouts
        limit = t.start_s + t.update_s + t.finish_s
        _run_bounded(f"weight version {version}", self.engine.send_weights, limit, self.client)

    def shutdown(self) -> None:
        """Tear down the trainer's communicator (the servers keep serving)."""
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()


def module_transfer(
    module: Any,
    *,
    rank: int,
    backend: Backend,
    base_urls: Sequence[str],
    timeout_s: float,
    bucket_bytes: int,
    master_address: str = "127.0.0.1",
    master_port: int = 0,
) -> TrainerTransfer:
    """A learner rank's :class:`TrainerTransfer` of ``module``'s parameters (FSDP-sharded or
    not: vLLM's ``ModuleSource`` gathers each), after the rendezvous. Collective: every rank."""
    from vllm.distributed.weight_transfer import ModuleSource

    transfer = TrainerTransfer(
        backend,
        base_urls,
        rank,
        ModuleSource(module),
        timeouts=PhaseTimeouts.within(timeout_s),
        bucket_bytes=bucket_bytes,
        master_address=master_address,
        master_port=master_port,
    )
    transfer.init()
    return transfer
