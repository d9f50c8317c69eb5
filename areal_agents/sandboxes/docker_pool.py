"""Containers for the docker backend: labels, the warm pool, and clean-up on every kind of exit.

Every container carries the label ``areal_agents.sandbox=1`` and its owner (host name, pid, and
the pid's start time, so a recycled pid is not mistaken for the owner). A process removes its own
containers at exit (``atexit``, and SIGTERM/SIGHUP handlers that clean up and then die as the
signal would have); Ctrl-C ends the interpreter normally and so runs ``atexit``. A process killed
with SIGKILL cannot clean up: the next process that opens a pool (or ``python -m
areal_agents.sandbox doctor``) removes containers whose owner is gone, see :func:`reap_orphans`.

The :class:`DockerPool` keeps ``size`` containers started and reset ahead of demand, so that an
episode's ``acquire`` is a pop from a list; released containers are reset in the background
(``_docker_exec.reset_container``: every process of the sandbox user killed; ``/work``, ``/tmp``,
``/dev/shm`` and POSIX message queues emptied, System V IPC objects removed, ``/work``'s mode,
times, extended attributes and ACLs restored; then checked), or replaced when the check fails or
after ``max_uses`` episodes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any

from areal_agents.errors import DependencyError, ImageNotFoundError, SandboxError
from areal_agents.sandboxes._docker_exec import ROOT_USER, SANDBOX_USER, reset_container
from areal_agents.sandboxes.base import SandboxLimits

__all__ = [
    "LABEL",
    "SANDBOX_USER",
    "DockerPool",
    "PoolKey",
    "docker_client",
    "get_pool",
    "owned_containers",
    "reap_orphans",
    "shutdown_all",
]

log = logging.getLogger(__name__)

LABEL = "areal_agents.sandbox"
# The container's own processes (init, keeper, supervisors) run as its root with only these
# capabilities; programs run as SANDBOX_USER with none, and cannot signal root's processes.
ROOT_CAPS = ["KILL", "SETUID", "SETGID", "SYS_CHROOT"]

_client: Any = None
_client_lock = threading.Lock()
_pools: dict[PoolKey, DockerPool] = {}
_pools_lock = threading.Lock()
_hooks_installed = False
_reaped = False


def docker_client() -> Any:
    """The process-wide Docker SDK client (raises DependencyError without the SDK)."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                import docker
            except ImportError:
                raise DependencyError(
                    "the docker SDK is not installed: pip install docker"
                ) from None
            _client = docker.from_env(timeout=120, max_pool_size=64)
        return _client


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_labels() -> dict[str, str]:
    """The labels that mark a container as this process's."""
    pid = os.getpid()
    return {
        LABEL: "1",
        f"{LABEL}.host": socket.gethostname(),
        f"{LABEL}.pid": str(pid),
        f"{LABEL}.pid_start": _start_time(pid) or "",
    }


def _owner_alive(labels: dict[str, str]) -> bool:
    if labels.get(f"{LABEL}.host") != socket.gethostname():
        return True  # another machine's container on a shared engine: not ours to judge
    try:
        pid = int(labels.get(f"{LABEL}.pid", ""))
    except ValueError:
        return False
    start = _start_time(pid)
    return start is not None and start == labels.get(f"{LABEL}.pid_start", start)


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)


def _remove_all(containers: list[Any]) -> None:
    """Remove containers, in parallel threads unless the interpreter is exiting."""
    if len(containers) <= 1 or sys.is_finalizing():
        for c in containers:
            _remove(c)
        return
    threads = [threading.Thread(target=_remove, args=(c,), daemon=True) for c in containers]
    try:
        for t in threads:
            t.start()
    except RuntimeError:  # no new threads at this stage of shutdown
        for c in containers:
            _remove(c)
        return
    for t in threads:
        t.join(timeout=60)


def owned_containers(client: Any = None, *, pid: int | None = None) -> list[Any]:
    """Containers labelled by this project (only ``pid``'s on this host, when given)."""
    client = client or docker_client()
    label = [f"{LABEL}=1"]
    if pid is not None:
        label += [f"{LABEL}.pid={pid}", f"{LABEL}.host={socket.gethostname()}"]
    return list(client.containers.list(all=True, filters={"label": label}))


def reap_orphans(client: Any = None) -> int:
    """Remove labelled containers whose owning process is gone; returns how many."""
    client = client or docker_client()
    dead = [c for c in owned_containers(client) if not _owner_alive(c.labels)]
    _remove_all(dead)
    if dead:
        log.warning("removed %d sandbox container(s) left by dead processes", len(dead))
    return len(dead)


@dataclass(frozen=True)
class PoolKey:
    """What makes two sandboxes interchangeable: the image and the limits."""

    image: str
    limits: SandboxLimits


class DockerPool:
    """Pre-started containers of one image and one set of limits.

    ``acquire`` hands out a ready container (or starts one when none is ready) and tops the ready
    list up to ``size`` in the background; ``release`` takes it back, and a background worker
    resets and re-shelves it (up to ``max_idle`` ready ones), or removes it.
    """

    def __init__(
        self, key: PoolKey, size: int = 2, *, max_uses: int = 64, max_idle: int | None = None
    ) -> None:
        self.key = key
        self.size = max(0, size)
        self.max_uses = max_uses
        # Reset containers are cheaper than new ones: keep more of them than the refill target.
        self.max_idle = max_idle if max_idle is not None else 2 * self.size + 4
        self.client = docker_client()
        self._ready: deque[Any] = deque()
        self._uses: dict[str, int] = {}
        self._live: dict[str, Any] = {}
        self._starting = 0
        self._closed = False
        self._cond = threading.Condition()
        self._workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="areal-sandbox-pool")
        self._refill()

    # --- the two verbs --------------------------------------------------------------------

    def acquire(self) -> Any:
        """A running, clean container; the caller owns it until :meth:`release`."""
        with self._cond:
            if self._closed:
                raise SandboxError("sandbox pool is shut down")
            container = self._ready.popleft() if self._ready else None
        self._refill()
        return container if container is not None else self.start()

    def release(self, container: Any, *, reusable: bool = True) -> None:
        """Give a container back: it is reset and re-shelved, or removed, in the background."""
        try:
            self._workers.submit(self._recycle, container, reusable)
        except RuntimeError:  # pool shut down: just remove it
            self._discard(container)

    # --- machinery --------------------------------------------------------------------------

    def start(self) -> Any:
        """Start one container with the pool's limits (blocking, ~0.3-0.5 s)."""
        lim = self.key.limits
        import docker.types

        mb = lim.memory_mb
        container = self.client.containers.run(
            self.key.image,
            command=["sleep", "infinity"],
            detach=True,
            init=True,
            user=ROOT_USER,
            network_mode="none",
            hostname="sandbox",
            mem_limit=f"{mb}m",
            memswap_limit=f"{mb}m",
            pids_limit=lim.pids,
            nano_cpus=int(lim.cpus * 1e9),
            read_only=True,
            tmpfs={
                "/work": f"size={lim.disk_mb}m,uid=65534,gid=65534,mode=0700,exec",
                "/tmp": f"size={lim.disk_mb}m,mode=1777,exec",
            },
            shm_size="16m",
            cap_drop=["ALL"],
            cap_add=ROOT_CAPS,
            security_opt=["no-new-privileges"],
            ulimits=[
                docker.types.Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
            labels=owner_labels(),
            working_dir="/work",
        )
        with self._cond:
            self._live[container.id] = container
            closed = self._closed
        if closed:
            self._discard(container)
            raise SandboxError("sandbox pool is shut down")
        return container

    def _refill(self) -> None:
        with self._cond:
            missing = self.size - len(self._ready) - self._starting
            if self._closed or missing <= 0:
                return
            self._starting += missing
        for _ in range(missing):
            try:
                self._workers.submit(self._start_one)
            except RuntimeError:
                return

    def _start_one(self) -> None:
        try:
            container = self.start()
        except Exception as e:  # the next acquire starts one itself and reports the error
            log.warning("warm pool could not start a sandbox container: %s", e)
            with self._cond:
                self._starting -= 1
            return
        with self._cond:
            self._starting -= 1
            self._ready.append(container)
            self._cond.notify_all()

    def _recycle(self, container: Any, reusable: bool) -> None:
        uses = self._uses.get(container.id, 0) + 1
        self._uses[container.id] = uses
        keep = reusable and uses < self.max_uses and not self._closed
        if keep:
            keep = reset_container(self.client, container.id)
        with self._cond:
            if keep and len(self._ready) < self.max_idle and not self._closed:
                self._ready.append(container)
                self._cond.notify_all()
                return
        self._discard(container)
        self._refill()

    def _discard(self, container: Any) -> None:
        with self._cond:
            self._live.pop(container.id, None)
            self._uses.pop(container.id, None)
        _remove(container)

    def shutdown(self) -> None:
        """Stop refilling and remove every container this pool started."""
        with self._cond:
            self._closed = True
            self._ready.clear()
        self._workers.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            live = list(self._live.values())
            self._live.clear()
        _remove_all(live)


def get_pool(image: str, limits: SandboxLimits, size: int) -> DockerPool:
    """The process's pool for ``(image, limits)``, created (and the image checked) on first use."""
    global _reaped
    key = PoolKey(image, limits)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is not None:
            return pool
        client = docker_client()
        check_image(client, image)
        if not _reaped:
            _reaped = True
            with contextlib.suppress(Exception):
                reap_orphans(client)
        _install_shutdown_hooks()
        pool = _pools[key] = DockerPool(key, size)
        return pool


def check_image(client: Any, image: str) -> None:
    """Fail fast (never pull) when ``image`` is missing."""
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageNotFoundError(
            f"sandbox image {image!r} not found; build it offline with "
            "`python -m areal_agents.sandbox build` (or set AREAL_SANDBOX_IMAGE)"
        ) from None
    except docker.errors.DockerException as e:
        raise SandboxError(f"Docker engine error while looking up {image!r}: {e}") from e


def shutdown_all() -> None:
    """Shut every pool down and remove any container this process still owns."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.shutdown()
    if _client is not None:
        with contextlib.suppress(Exception):
            _remove_all(owned_containers(_client, pid=os.getpid()))


def _on_signal(signum: int, frame: FrameType | None) -> None:
    shutdown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)  # the default action ends the process


def _install_shutdown_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(shutdown_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
