"""Weights as one safetensors file in node-local shared memory: written in place, read as views.

A push with ``inference.weight_sync=object_store`` ends on the server's node with the learner's
tensors in this process (out of Ray's object store) and a server in another process that must
take them. They meet in a safetensors file under ``/dev/shm`` (a tmpfs: memory, not a disk):

* :class:`StagingFile` (the writer) owns one such file and rewrites it in place at every push,
  through a memory map it keeps open: the header (JSON) and then each tensor's raw bytes are
  copied straight from the tensors into the file, once, with none of the costs of a fresh file
  (tmpfs pages allocated and zeroed again, a page fault per 4 KiB). Its size is allocated up
  front (``posix_fallocate``), so a full ``/dev/shm`` is a :class:`WeightSyncError` (after one
  try in the temp directory), never a ``SIGBUS``. A file of another size replaces it atomically
  (a reader that has the old one mapped keeps reading the old one).
* :func:`mapped_tensors` (the reader) maps a safetensors file read-only and returns tensors that
  are views of it, after checking the header against the file's size; :func:`copy_into` copies
  one into a parameter with a single-threaded ``memcpy`` (on two busy cores torch's two-thread
  ``copy_`` of 512 MB took 0.37 s, one ``memcpy`` 0.13 s).

The file is an ordinary safetensors file (``safetensors.safe_open`` and vLLM's loader read it).
A staging directory is named after its writer's process (``areal-weights-<ns>-<pid>-*``) and
removed by :meth:`StagingFile.close`, at interpreter exit, or, when its writer was killed, by
the next :class:`StagingFile` created on the node.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
import shutil
import struct
import tempfile
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.errors import WeightSyncError

if TYPE_CHECKING:
    import torch

__all__ = [
    "FILE_NAME",
    "StagingFile",
    "checkpoint_tensors",
    "copy_into",
    "mapped_tensors",
    "safetensors_files",
    "safetensors_header",
    "shm_root",
]

logger = logging.getLogger(__name__)

FILE_NAME = "model.safetensors"
"""The staged file's name inside its directory (the directory is what a server is given)."""

_PREFIX = "areal-weights-"

#: torch dtype name -> safetensors dtype code
_CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
_NAMES = {code: name for name, code in _CODES.items()}
_MAX_HEADER = 100 << 20  # safetensors' own limit on the header's size


def shm_root() -> str:
    """Node-local shared memory (``/dev/shm``) when writable, else the temp directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _pid_namespace() -> int:
    """This process's pid namespace (0 where ``/proc`` does not say): a pid means a process
    only within one namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _reap_orphans(root: str) -> None:
    """Remove the staging directories under ``root`` whose writer (in this pid namespace) is
    gone: a killed trainer or server host never ran :meth:`StagingFile.close`."""
    namespace = _pid_namespace()
    if not namespace:
        return
    mine = f"{_PREFIX}{namespace}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if not entry.name.startswith(mine):
                continue
            pid = entry.name[len(mine) :].partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _flat_bytes(tensor: torch.Tensor) -> Any:
    """The raw bytes of ``tensor`` as a flat uint8 numpy array (a view for a dense CPU tensor)."""
    import torch

    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def safetensors_header(
    entries: Mapping[str, tuple[str, tuple[int, ...], int]],
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The safetensors header of tensors ``name -> (torch dtype name, shape, byte size)`` laid
    out in the given order, padded with spaces to a multiple of 8 bytes as safetensors pads
    it; and each tensor's ``(begin, end)`` byte offsets in the data that follows."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, tuple[int, int]] = {}
    at = 0
    for name, (dtype, shape, size) in entries.items():
        code = _CODES.get(dtype)
        if code is None:
            raise WeightSyncError(f"{name}: dtype {dtype} has no safetensors code")
        offsets[name] = (at, at + size)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + size]}
        at += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8), offsets


class StagingFile:
    """One safetensors file in shared memory, rewritten in place by each :meth:`write`.

    Not thread-safe: one writer, and a reader only between writes (a push is sequential).
    """

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        """Where the staging directory goes (None: :func:`shm_root`)."""
        self.directory: Path | None = None
        """The staging directory (one file, :data:`FILE_NAME`); None before the first write."""
        self._map: mmap.mmap | None = None
        self._finalizer: weakref.finalize[..., Any] | None = None

    @property
    def path(self) -> Path | None:
        """The staged file (None before the first write)."""
        return None if self.directory is None else self.directory / FILE_NAME

    def write(self, tensors: Mapping[str, torch.Tensor]) -> Path:
        """Stage ``tensors`` (a CPU state dict) and return the directory holding the file.

        A tensor sharing storage with an earlier one (a tied output head) is left out: a server
        keeps a missing tensor tied, as it does when loading a checkpoint without it. Tensors
        are laid out widest dtype first, so every one starts aligned to its element size.
        """
        import numpy as np

        flat: dict[str, Any] = {}
        entries: dict[str, tuple[str, tuple[int, ...], int]] = {}
        seen: set[tuple[int, int]] = set()
        order = sorted(tensors.items(), key=lambda kv: -kv[1].element_size())  # stable
        for name, tensor in order:
            key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))
            if key in seen and tensor.numel():
                continue
            seen.add(key)
            flat[name] = _flat_bytes(tensor)
            dtype = str(tensor.dtype).removeprefix("torch.")
            entries[name] = (dtype, tuple(tensor.shape), int(flat[name].nbytes))
        header, offsets = safetensors_header(entries)
        start = 8 + len(header)
        size = start + sum(a.nbytes for a in flat.values())
        if self._map is None or len(self._map) != size:
            self._allocate(size)
        assert self._map is not None and self.directory is not None
        view = np.frombuffer(self._map, dtype=np.uint8)
        try:
            view[:8] = np.frombuffer(struct.pack("<Q", len(header)), dtype=np.uint8)
            view[8:start] = np.frombuffer(header, dtype=np.uint8)
            for name, data in flat.items():
                begin, end = offsets[name]
                np.copyto(view[start + begin : start + end], data)
        finally:
            del view  # an exported view would keep the map from closing
        return self.directory

    def _allocate(self, size: int) -> None:
        """A new file of ``size`` bytes, mapped, in place of the old one (atomically)."""
        if self.directory is not None:
            roots = [str(self.directory.parent)]
        elif self.root is not None:
            roots = [self.root]
        else:  # a small /dev/shm (a container's 64 MB): the temp directory next
            roots = list(dict.fromkeys([shm_root(), tempfile.gettempdir()]))
        for i, root in enumerate(roots):
            try:
                self._allocate_in(root, size)
                return
            except OSError as e:
                last = i == len(roots) - 1
                if self._map is None:  # nothing staged here yet: leave nothing behind
                    self.close()
                if last or e.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise WeightSyncError(
                        f"no room for a {size / 2**20:.0f} MiB weight file under {root}: {e}"
                    ) from None
                logger.warning(
                    "no room for %.0f MiB of weights under %s; staging them under %s",
                    size / 2**20,
                    root,
                    roots[i + 1],
                )

    def _allocate_in(self, root: str, size: int) -> None:
        if self.directory is None:
            _reap_orphans(root)
            name = f"{_PREFIX}{_pid_namespace()}-{os.getpid()}-"
            self.directory = Path(tempfile.mkdtemp(prefix=name, dir=root))
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)
        tmp = self.directory / (FILE_NAME + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # ENOSPC now, not SIGBUS on a write later
            new = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / FILE_NAME)
        old, self._map = self._map, new
        if old is not None:
            old.close()

    def close(self) -> None:
        """Unmap and remove the file and its directory (idempotent)."""
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self._finalizer is not None:
            self._finalizer()  # removes the directory, once
            self._finalizer = None
        self.directory = None


def safetensors_files(path: str | Path) -> list[Path]:
    """The files of the safetensors checkpoint at ``path``: every ``*.safetensors`` file of a
    directory, in order, or ``path`` itself; a :class:`WeightSyncError` where there is none."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise WeightSyncError(f"no safetensors weights at {path}")
    return files


def checkpoint_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors checkpoint at ``path`` (:func:`safetensors_files`), each
    a read-only view of its file's memory map (:func:`mapped_tensors`)."""
    state: dict[str, torch.Tensor] = {}
    for f in safetensors_files(path):
        state.update(mapped_tensors(f))
    return state


def mapped_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path`` as read-only views of a memory map (write
    nothing into them); the map lives as long as any of them. The header is checked against
    the file first: a bad file is a :class:`WeightSyncError`."""
    import torch

    def bad(why: str) -> WeightSyncError:
        return WeightSyncError(f"{path} is not a safetensors file: {why}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise bad(f"{size} bytes")
        m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    (length,) = struct.unpack("<Q", m[:8])
    if length > min(size - 8, _MAX_HEADER):
        raise bad(f"a header of {length} bytes in a file of {size}")
    try:
        header = json.loads(m[8 : 8 + length])
    except ValueError as e:
        raise bad(f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    start, data_len = 8 + length, size - 8 - length
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # the map is read-only, and so are the views: only read
        warnings.simplefilter("ignore", UserWarning)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = getattr(torch, _NAMES[meta["dtype"]])
                shape = [int(d) for d in meta["shape"]]
                begin, end = (int(x) for x in meta["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise bad(f"entry {name!r} is {meta!r}") from None
            numel = 1
            for d in shape:
                numel *= d
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len:
                raise bad(f"entry {name!r} lies outside the file")
            if end - begin != numel * dtype.itemsize:
                raise bad(f"entry {name!r} has {end - begin} bytes for shape {shape}")
            if numel == 0:
                out[name] = torch.empty(shape, dtype=dtype)
                continue
            flat = torch.frombuffer(m, dtype=dtype, count=numel, offset=start + begin)
            out[name] = flat.view(shape)
    return out


def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target[...] = source`` (same shape): one single-threaded ``memcpy`` when both are dense
    CPU tensors of one dtype (torch's multi-threaded ``copy_`` stalls on busy cores), else
    torch's ``copy_`` (another device or dtype)."""
    import numpy as np

    dense = target.is_contiguous() and source.is_contiguous() and target.numel() > 0
    cpu = target.device.type == "cpu" and source.device.type == "cpu"
    if dense and cpu and target.dtype == source.dtype:
        np.copyto(_flat_bytes(target), _flat_bytes(source))
    else:
        target.copy_(source.to(target.device, target.dtype))
