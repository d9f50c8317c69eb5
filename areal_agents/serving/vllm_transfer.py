"""The control plane of vLLM's native weight transfer (``nccl`` or ``ipc`` backend), over HTTP.

vLLM (0.16 and later, server started with ``--weight-transfer-config '{"backend": "nccl"}'``
and ``VLLM_SERVER_DEV_MODE=1``) updates weights in four phases, each a route of its server:

1. ``POST /init_weight_transfer_engine`` ``{"init_info": {...}}`` — once, before training: the
   backend's rendezvous (``nccl``: ``master_address``, ``master_port``, ``rank_offset``,
   ``world_size``; ``ipc``: ``packed``).
2. ``POST /start_weight_update`` — per version: the engine prepares to take weights.
3. ``POST /update_weights`` ``{"update_info": {"names", "dtype_names", "shapes", ...}}`` — once
   per bucket of tensors; the request returns when the engine has received the bucket, which
   the trainer sends meanwhile through vLLM's trainer-side engine
   (``vllm.distributed.weight_transfer``: NCCL broadcast, or CUDA IPC handles in
   ``update_info``) — the *data plane*, which this module does not implement.
4. ``POST /finish_weight_update`` ``{"weight_version": "N"}`` — per version: post-processing,
   and the version the server tags new tokens with.

:class:`WeightTransferClient` drives these phases with a timeout per phase and raises
:class:`~areal_agents.errors.WeightSyncError` naming the phase, the server and what to check;
:func:`buckets` groups tensors into ``update_info`` bodies of bounded size; :func:`push_version`
runs phases 2-4 for one version, with each bucket's data-plane send running alongside its
``/update_weights`` request. Only the control plane has run here (against a fake server); the
data plane needs GPUs.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from areal_agents.errors import WeightSyncError

__all__ = [
    "PhaseTimeouts",
    "TensorSpec",
    "WeightTransferClient",
    "buckets",
    "push_version",
    "update_info",
]


@dataclass(frozen=True)
class PhaseTimeouts:
    """Seconds each phase of one weight transfer may take before :class:`WeightSyncError`."""

    init_s: float = 300.0
    """``/init_weight_transfer_engine`` (a rendezvous: every rank must join)."""
    start_s: float = 60.0
    """``/start_weight_update``."""
    update_s: float = 120.0
    """One bucket: its ``/update_weights`` request and its data-plane send."""
    finish_s: float = 120.0
    """``/finish_weight_update``."""


@dataclass(frozen=True)
class TensorSpec:
    """What the server must know of one tensor before it arrives: name, dtype, shape."""

    name: str
    dtype_name: str
    """torch's name without ``torch.``: ``bfloat16``, ``float32``..."""
    shape: tuple[int, ...]
    nbytes: int


def buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """``specs`` in order, grouped so that no bucket exceeds ``bucket_bytes`` (a tensor larger
    than that gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be positive")
    out: list[list[TensorSpec]] = []
    size = 0
    for spec in specs:
        if not out or size + spec.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += spec.nbytes
    return out


def update_info(bucket: Sequence[TensorSpec], **extra: Any) -> dict[str, Any]:
    """The ``update_info`` body of one bucket (``extra``: backend fields, e.g. IPC handles)."""
    return {
        "names": [s.name for s in bucket],
        "dtype_names": [s.dtype_name for s in bucket],
        "shapes": [list(s.shape) for s in bucket],
        **extra,
    }


class WeightTransferClient:
    """One vLLM server's weight-transfer routes, each call bounded by its phase's timeout."""

    def __init__(self, base_url: str, timeouts: PhaseTimeouts | None = None) -> None:
        self.root_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeouts = timeouts or PhaseTimeouts()

    def _post(self, phase: str, route: str, timeout: float, body: Any = None) -> None:
        try:
            response = httpx.post(f"{self.root_url}{route}", json=body, timeout=timeout)
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

    def init_engine(self, init_info: Mapping[str, Any]) -> None:
        """Phase 1: the backend's rendezvous (once)."""
        body = {"init_info": dict(init_info)}
        self._post("init", "/init_weight_transfer_engine", self.timeouts.init_s, body)

    def start(self) -> None:
        """Phase 2: the server prepares for a new version."""
        self._post("start", "/start_weight_update", self.timeouts.start_s)

    def update(self, info: Mapping[str, Any]) -> None:
        """Phase 3, one bucket: returns when the server has received it."""
        body = {"update_info": dict(info)}
        self._post("update", "/update_weights", self.timeouts.update_s, body)

    def finish(self, version: int) -> None:
        """Phase 4: post-processing; the server serves ``version`` from now on."""
        body = {"weight_version": str(version)}
        self._post("finish", "/finish_weight_update", self.timeouts.finish_s, body)


def push_version(
    client: WeightTransferClient,
    version: int,
    bucket_list: Sequence[Sequence[TensorSpec]],
    send: Callable[[int, Sequence[TensorSpec]], None],
) -> None:
    """Phases 2-4 for ``version``: each bucket's ``/update_weights`` request and its data-plane
    ``send(index, bucket)`` run together (the request returns only once the data arrived), both
    within ``update_s``; a failure of either raises :class:`WeightSyncError`."""
    client.start()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-update")
    try:
        for index, bucket in enumerate(bucket_list):
            request = pool.submit(client.update, update_info(bucket))
            try:
                send(index, bucket)
            except Exception as e:
                raise WeightSyncError(
                    f"update: sending bucket {index} of version {version} failed: {e}"
                ) from e
            try:
                request.result(timeout=client.timeouts.update_s)
            except concurrent.futures.TimeoutError:
                raise WeightSyncError(
                    f"update: bucket {index} of version {version} not acknowledged by "
                    f"{client.root_url} within {client.timeouts.update_s:g}s"
                ) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # never wait on a stuck request
    client.finish(version)
