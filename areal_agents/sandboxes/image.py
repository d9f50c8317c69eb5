"""Building the sandbox image, with or without a container registry.

Two recipes make equivalent images (Python 3 with its standard library, coreutils' ``timeout``,
``chroot`` and ``realpath``, which the docker backend's supervisor and file operations use, a
shell, a non-root user ``sandbox`` with uid 65534, work directory ``/work``):

* ``host`` (the default, offline): copies the files of the host's installed Debian ``python3``,
  ``coreutils``, ``dash`` and ``findutils`` packages and everything they depend on into a tar,
  and ``docker import``\\ s it. Needs a Debian-family host with those packages; no network.
* ``dockerfile``: ``docker build`` of the ``Dockerfile`` next to this module, from a slim Python
  base image, for users whose engine can pull from a registry.

No code path here pulls an image implicitly.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from areal_agents.errors import ConfigError, SandboxUnavailableError

__all__ = [
    "DEFAULT_IMAGE",
    "DOCKERFILE",
    "build_image",
    "default_image",
    "host_packages",
]

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "areal-agents-sandbox:latest"
DOCKERFILE = Path(__file__).with_name("Dockerfile")
ROOT_PACKAGES = ("python3", "coreutils", "dash", "findutils")
# Dependencies a sandbox never uses (package management, configuration front-ends).
_SKIP_PACKAGES = {"dpkg", "debconf", "perl-base", "debianutils", "init-system-helpers", "tar"}
_SKIP_PREFIXES = (
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/info",
    "/usr/share/locale",
    "/usr/share/lintian",
    "/usr/share/bug",
)
_PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "nobody:x:65533:65533:nobody:/nonexistent:/usr/sbin/nologin\n"
    "sandbox:x:65534:65534:sandbox:/work:/bin/sh\n"
)
_GROUP = "root:x:0:\nnogroup:x:65533:\nsandbox:x:65534:\n"
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV HOME=/work",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "WORKDIR /work",
    "USER 65534:65534",
    'CMD ["sleep", "infinity"]',
    "LABEL areal_agents.image=1",
)


def default_image() -> str:
    """``$AREAL_SANDBOX_IMAGE`` or ``areal-agents-sandbox:latest``."""
    return os.environ.get("AREAL_SANDBOX_IMAGE") or DEFAULT_IMAGE


def _dpkg(*args: str) -> str:
    out = subprocess.run(
        ["dpkg-query", *args], capture_output=True, text=True, check=False, timeout=60
    )
    return out.stdout


def _installed(name: str) -> bool:
    return "install ok installed" in _dpkg("-W", "-f=${Status}", name)


def host_packages(roots: tuple[str, ...] = ROOT_PACKAGES) -> list[str]:
    """``roots`` and their installed dependencies (Depends and Pre-Depends), sorted."""
    if shutil.which("dpkg-query") is None:
        raise SandboxUnavailableError(
            "the offline image recipe copies Debian packages from the host, and dpkg-query is "
            "missing: build with --method dockerfile on an engine that can pull a base image"
        )
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in _SKIP_PACKAGES:
            continue
        if not _installed(name):
            if name in roots:
                raise SandboxUnavailableError(
                    f"host package {name} is not installed (apt-get install {name}), or build "
                    "with --method dockerfile"
                )
            continue
        seen.add(name)
        deps = _dpkg("-W", "-f=${Depends}, ${Pre-Depends}", name)
        for clause in deps.split(","):
            # "a (>= 1) | b" -> the first alternative that is installed
            options = [re.split(r"[ :(]", alt.strip())[0] for alt in clause.split("|")]
            options = [o for o in options if o]
            for opt in options:
                if _installed(opt):
                    todo.append(opt)
                    break
    return sorted(seen)


def _host_files(packages: list[str]) -> list[str]:
    files: set[str] = set()
    for pkg in packages:
        for line in _dpkg("-L", pkg).splitlines():
            path = line.strip()
            if path.startswith("/") and not path.startswith(_SKIP_PREFIXES):
                files.add(path)
    return sorted(files)


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755, owner: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, owner, owner
    info.mtime = int(time.time())
    tar.addfile(info)


def write_host_rootfs(out: Path) -> int:
    """Write the offline image's root file system as a tar; returns the number of entries."""
    files = _host_files(host_packages())
    count = 0
    seen: set[str] = {"", "."}
    with tarfile.open(out, "w") as tar:
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            link = Path("/") / name
            if link.is_symlink():  # merged /usr: keep the links as links
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(link)
                tar.addfile(info)
                seen.add(name)
        for d, mode in (("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755)):
            _add_dir(tar, d, mode)
        _add_dir(tar, "etc")
        seen.update(("etc", "tmp", "proc", "sys", "dev", "work"))
        _add_dir(tar, "work", 0o755, owner=65534)
        _add_text(tar, "etc/passwd", _PASSWD)
        _add_text(tar, "etc/group", _GROUP)
        _add_text(tar, "etc/hostname", "sandbox\n")

        def add(path: str) -> None:
            nonlocal count
            rel = path.lstrip("/")
            if rel in seen or not os.path.lexists(path):
                return
            parent = os.path.dirname(path)
            if parent not in ("/", "") and not os.path.islink(parent):
                add(parent)
            seen.add(rel)
            if os.path.isdir(path) and not os.path.islink(path):
                tar.add(path, arcname=rel, recursive=False)
            else:
                tar.add(path, arcname=rel)
            count += 1

        for path in files:
            # A path under a merged-/usr link (/lib/x86_64-linux-gnu/...) lives in /usr.
            real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            add(real)
        for extra in ("/etc/ld.so.cache", "/etc/localtime"):
            add(extra)
        py = Path("/usr/lib/python3.11")
        stdlibs = sorted(Path("/usr/lib").glob("python3.[0-9]*"))
        for lib in stdlibs or [py]:
            for root, dirs, names in os.walk(lib):
                dirs[:] = [d for d in dirs if d not in ("__pycache__", "test", "idlelib")]
                for n in names:
                    add(os.path.join(root, n))
    return count


def _image_exists(client: Any, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_image(
    name: str | None = None,
    *,
    method: str = "host",
    if_missing: bool = False,
    client: Any = None,
) -> tuple[str, bool]:
    """Build the sandbox image; returns ``(name, built)``. ``if_missing``: keep an existing one."""
    import docker

    name = name or default_image()
    client = client or docker.from_env(timeout=120)
    if if_missing and _image_exists(client, name):
        return name, False
    previous = _image_id(client, name)
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    if method == "host":
        with tempfile.TemporaryDirectory(prefix="areal-image-") as tmp:
            tar_path = Path(tmp) / "rootfs.tar"
            write_host_rootfs(tar_path)
            client.api.import_image_from_file(
                str(tar_path), repository=repo, tag=tag, changes=list(IMAGE_CHANGES)
            )
    elif method == "dockerfile":
        # The one path that fetches a base image, and only because the user asked for it.
        proc = subprocess.run(
            ["docker", "build", "-t", name, "-f", str(DOCKERFILE), str(DOCKERFILE.parent)],
            check=False,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
        if proc.returncode != 0:
            raise SandboxUnavailableError(f"docker build failed (exit {proc.returncode})")
    else:
        raise ConfigError(f"unknown image build method {method!r}: choose host or dockerfile")
    current = _image_id(client, name)
    if current is None:
        raise SandboxUnavailableError(f"building {name} reported success but no image exists")
    if previous is not None and previous != current:
        _remove_replaced(client, previous, name)
    return name, True


def _image_id(client: Any, name: str) -> str | None:
    import docker.errors

    try:
        return str(client.images.get(name).id)
    except docker.errors.ImageNotFound:
        return None


def _remove_replaced(client: Any, image_id: str, name: str) -> bool:
    """Remove the image a rebuild of ``name`` replaced, unless a container (in any state) or
    another tag still uses it; True when it was removed."""
    import docker.errors

    try:
        image = client.images.get(image_id)
        if image.tags:  # still tagged (another name): not ours to remove
            return False
        if client.containers.list(all=True, filters={"ancestor": image_id}):
            logger.info("previous %s image %s is still used by a container: kept", name, image_id)
            return False
        client.images.remove(image_id, noprune=False)
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as e:  # in use after all (a race): keep it
        logger.info("previous %s image %s kept: %s", name, image_id, e)
        return False
    logger.info("removed the previous %s image %s", name, image_id)
    return True
