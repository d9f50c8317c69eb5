"""The weight push that follows every optimizer step: :class:`WeightSync`.

A push of version ``v`` has two halves. The *learner's* half takes the new weights off the
learners: it writes a safetensors directory (``inference.weight_sync=disk``), hands over the
state dict (``state_dict``), leaves it in Ray's object store for the server's node to load
(``object_store``, :mod:`areal_agents.trainers.object_store`), or, with LoRA, takes the adapter
only. The *servers'* half loads what it took into every server and checks that each one serves
``v``; a server that fails or does not answer in time raises
:class:`~areal_agents.errors.WeightSyncError`, never a silent hang. The servers interrupt the
generations in flight, swap the weights and continue them, tagging new tokens with ``v``.

:meth:`WeightSync.start` does the learner's half before it returns, so the learners hold a
snapshot no later step can change, and runs the servers' half in the background: the next
training step overlaps the servers' load (``trainer.overlap_weight_push``). The returned
:class:`PendingPush` is joined before the next push starts; ``on_served`` (the buffer's
``set_version``) is called once every server serves ``v``, so admission under the staleness
bound always counts the version the servers actually generate with. :meth:`WeightSync.push` is
the same, waited for at once.

vLLM's own weight transfer (``weight_sync=nccl|ipc``, :mod:`areal_agents.serving.vllm_transfer`:
the servers are paused, learner rank 0 broadcasts, each server's ``/finish_weight_update``
sets the version) keeps the learners busy for the whole push, so it is never overlapped.
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from areal_agents.errors import WeightSyncError
from areal_agents.serving.base import InferenceServer
from areal_agents.trainers.config import InferenceConfig, LoraConfig
from areal_agents.trainers.object_store import ShmLoader

__all__ = ["VLLM_TRANSFER", "PendingPush", "WeightSync"]

VLLM_TRANSFER = ("nccl", "ipc")
"""``weight_sync`` modes that are vLLM's own weight transfer, driven from the learner ranks."""

_Call = tuple[list[InferenceServer], Callable[..., None], Any]
"""One part of the servers' half of a push: ``(the servers it loads, update, argument)``, run
as ``update(argument, version, timeout)``."""

_Calls = Callable[[list[InferenceServer]], list[_Call]]
"""The servers' half of one version, for any list of servers: what a push loads into every
server, and what a restarted server is loaded with again (:meth:`WeightSync.reload`)."""


def _adapter_push(server: InferenceServer, scaling: float) -> Callable[..., None]:
    """``server``'s LoRA adapter update as ``fn(adapter, version, timeout)``."""
    update = getattr(server, "update_adapter", None)
    if update is None:
        raise WeightSyncError(f"the server at {server.base_url} takes no LoRA adapter push")

    def push(adapter: Mapping[str, Any], version: int, timeout: float) -> None:
        update(adapter, scaling, version, timeout)

    return push


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


class PendingPush:
    """A push whose servers' half may still run: :meth:`wait` joins it."""

    def __init__(self, version: int, future: concurrent.futures.Future[float], limit_s: float):
        self.version = version
        self._future = future
        self._limit_s = limit_s

    def done(self) -> bool:
        """Whether every server has loaded the version (or the push failed)."""
        return self._future.done()

    def wait(self) -> float:
        """Block until every server serves :attr:`version`; returns the push's seconds from
        its start to the last server serving it. Raises its :class:`WeightSyncError`."""
        try:
            return self._future.result(timeout=self._limit_s)
        except concurrent.futures.TimeoutError:
            raise WeightSyncError(
                f"weight version {self.version}: the servers did not load it within "
                f"{self._limit_s:.0f}s (inference.weight_sync_timeout_s)"
            ) from None


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
        alive: Callable[[InferenceServer], bool] | None = None,
    ) -> None:
        self.cfg = cfg
        self.alive = alive or (lambda server: True)
        """Whether a server still runs (``trainers/inference.py:server_alive``): a push passes
        over one that died."""
        self.mode = cfg.resolved_weight_sync(on_cluster)
        self.lora = lora if lora is not None and lora.enabled else None
        """With LoRA on, each push sends only the adapter (the servers keep the base)."""
        self.servers = servers
        self.weights_dir = weights_dir
        self.last_push_s = 0.0
        """Seconds the last finished push took, from its start to every server serving it."""
        self.served_versions: list[int] = [0] * len(servers)
        """The version each server serves (0: the weights it started with)."""
        #: extra seconds granted beyond the servers' own timeout before giving up on them
        self.grace_s = 60.0
        self.settle_s = 5.0
        """How long a server whose call failed or hung may take to be seen dead (:meth:`_gone`)."""
        self._transfer_ready = False
        self._loader: ShmLoader | None = None  # object_store: the staged file of local servers
        self._pending: PendingPush | None = None  # the loop's push in flight (push_step)
        self._latest: tuple[int, _Calls] | None = None  # the newest version, for reload()
        # the servers' halves, one at a time, in the order the pushes started
        self._background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="push")
        if self.mode not in self._MODES:
            raise WeightSyncError(f"unknown inference.weight_sync={self.mode!r}")

    # ---- the learner's half of each mode: ``fn(learners, version) -> calls``, the servers'
    # half for any servers (:data:`_Calls`); the learners are not needed for it

    def _adapter_calls(self, learners: Any, version: int) -> _Calls:
        """The LoRA adapter only, merged by each server onto its base."""
        assert self.lora is not None
        adapter, scaling = learners.adapter_state(), self.lora.scaling
        return lambda servers: [([s], _adapter_push(s, scaling), adapter) for s in servers]

    def _disk_calls(self, learners: Any, version: int) -> _Calls:
        target = self.weights_dir / f"v{version:06d}"
        learners.export_weights(target)  # kept until a later version is served
        return lambda servers: [([s], s.update_weights_from_disk, str(target)) for s in servers]

    def _object_store_calls(self, learners: Any, version: int) -> _Calls:
        """The weights are staged on each server's node: by the host actor of a server on a
        cluster node (one staged file per server), here for all the servers this process
        started (one file for them all)."""
        refs = [learners.state_ref()]  # in a list: Ray passes it on unresolved

        def calls(servers: list[InferenceServer]) -> list[_Call]:
            hosted = [s for s in servers if hasattr(s, "update_weights_from_ref")]
            out: list[_Call] = [([s], s.update_weights_from_ref, refs) for s in hosted]
            local = [s for s in servers if not hasattr(s, "update_weights_from_ref")]
            if local:
                if self._loader is None:
                    self._loader = ShmLoader()
                out.append((local, functools.partial(self._loader.load, local), refs))
            return out

        return calls

    def _state_dict_calls(self, learners: Any, version: int) -> _Calls:
        state = learners.full_state()
        return lambda servers: [([s], s.update_weights_from_state_dict, state) for s in servers]

    def _vllm_transfer_calls(self, learners: Any, version: int) -> _Calls:
        """vLLM's own transfer: the learner ranks send; one call for all servers (run before
        :meth:`start` returns: the learners take part in it)."""

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

        return lambda servers: [(list(servers), send, None)]

    _MODES: ClassVar[dict[str, Callable[[WeightSync, Any, int], _Calls]]] = {
        "disk": _disk_calls,
        "object_store": _object_store_calls,
        "state_dict": _state_dict_calls,
        "nccl": _vllm_transfer_calls,
        "ipc": _vllm_transfer_calls,
    }

    # ---- pushing -------------------------------------------------------------------------

    def start(
        self, learners: Any, version: int, on_served: Callable[[int], Any] | None = None
    ) -> PendingPush:
        """Take version ``version`` off the learners now and load it into every server in the
        background; ``on_served(version)`` runs there once all of them serve it.

        When this returns the learners may train on: what the servers load is a snapshot.
        """
        start = time.perf_counter()
        timeout = self.cfg.weight_sync_timeout_s
        if self.lora is not None:
            calls = self._adapter_calls(learners, version)
        else:
            calls = self._MODES[self.mode](self, learners, version)
        self._latest = (version, calls)
        targets = list(self.servers)
        future = self._background.submit(
            self._load, calls(targets), targets, version, start, on_served
        )
        pending = PendingPush(version, future, timeout + 2 * (self.grace_s + self.settle_s))
        if self.lora is None and self.mode in VLLM_TRANSFER:
            pending.wait()  # the learners send it themselves: nothing to overlap
        return pending

    def push(self, learners: Any, version: int) -> float:
        """Send version ``version`` to every server and wait; returns the seconds it took."""
        return self.start(learners, version).wait()

    def push_step(
        self,
        learners: Any,
        version: int,
        *,
        overlap: bool,
        on_served: Callable[[int], Any] | None = None,
    ) -> float:
        """The training loop's push after the optimizer step that made ``version``: wait for
        the previous push, start this one, and, unless ``overlap``, wait for it too. Returns
        the seconds the caller was held (``time/sync_s``)."""
        start = time.perf_counter()
        self.join()
        self._pending = self.start(learners, version, on_served)
        if not overlap:
            self.join()
        return time.perf_counter() - start

    def join(self) -> None:
        """Wait until the push :meth:`push_step` left running is served (or raise its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def reload(self, indices: list[int]) -> int:
        """Load the newest version pushed into the servers at ``indices`` (restarted ones),
        after any push in progress, without the learners; returns that version (0, and nothing
        loaded, before the first push: the servers start with version 0's weights)."""
        if self.lora is None and self.mode in VLLM_TRANSFER:
            raise WeightSyncError(
                f"inference.weight_sync={self.mode}: a restarted server cannot be given the "
                "current weights (vLLM's transfer group is set up once, with every server); "
                "use inference.weight_sync=disk or object_store for runs that restart servers"
            )
        future = self._background.submit(self._reload, indices)
        return future.result(
            timeout=self.cfg.weight_sync_timeout_s + 2 * (self.grace_s + self.settle_s)
        )

    def _reload(self, indices: list[int]) -> int:
        if self._latest is None:
            return 0
        version, calls = self._latest
        targets = [self.servers[i] for i in indices]
        self._load(calls(targets), targets, version, time.perf_counter(), None, push=False)
        return version

    def _gone(self, servers: list[InferenceServer], settle_s: float = 0.0) -> bool:
        """Whether any of ``servers`` died or was replaced (its restart loads the version);
        ``settle_s``: how long a server whose call just failed may take to be seen dead (its
        connections are reset before its process ends, and an actor's death takes a moment to
        reach the driver)."""
        deadline = time.monotonic() + settle_s
        while True:
            if any(not any(s is now for now in self.servers) or not self.alive(s) for s in servers):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _load(
        self,
        calls: list[_Call],
        targets: list[InferenceServer],
        version: int,
        start: float,
        on_served: Callable[[int], Any] | None,
        *,
        push: bool = True,
    ) -> float:
        """The servers' half: every call at once, with a time limit; then the check that each
        server of ``targets`` serves ``version``. A server that died meanwhile is passed over:
        its restart loads the newest version (:meth:`reload`)."""
        timeout = self.cfg.weight_sync_timeout_s
        pool = concurrent.futures.ThreadPoolExecutor(max(1, len(calls)), thread_name_prefix="push")
        try:
            futures = {pool.submit(fn, arg, version, timeout): who for who, fn, arg in calls}
            done, pending = concurrent.futures.wait(futures, timeout=timeout + self.grace_s)
            if any(not self._gone(futures[f], settle_s=self.settle_s) for f in pending):
                raise WeightSyncError(
                    f"weight version {version}: {len(pending)} server(s) did not answer within "
                    f"{timeout}s (inference.weight_sync_timeout_s)"
                )
            for f in done:
                error = f.exception()
                if error is None or self._gone(futures[f], settle_s=self.settle_s):
                    continue
                if isinstance(error, WeightSyncError):
                    raise error
                raise WeightSyncError(f"weight version {version}: {error}") from error
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # never wait on a stuck server
        served: dict[int, int] = {}
        for s in targets:
            try:
                if not self._gone([s]):
                    served[id(s)] = int(s.weight_version())
            except Exception:
                if not self._gone([s], settle_s=self.settle_s):
                    raise
        if any(v != version for v in served.values()):
            raise WeightSyncError(
                f"pushed weight version {version} but the servers serve {list(served.values())}"
            )
        for i, s in enumerate(self.servers):
            if id(s) in served:
                self.served_versions[i] = version
        if not push:
            return 0.0
        if self.mode == "disk" and self.lora is None:
            for old in self.weights_dir.glob("v*"):
                if old.name != f"v{version:06d}":
                    shutil.rmtree(old, ignore_errors=True)
        if on_served is not None:
            on_served(version)
        self.last_push_s = time.perf_counter() - start
        return self.last_push_s

    def close(self) -> None:
        """Release what the pushes keep between them (the staged file of ``object_store``)."""
        self._background.shutdown(wait=False, cancel_futures=True)
        if self._loader is not None:
            self._loader.close()
            self._loader = None
