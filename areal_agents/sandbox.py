"""``python -m areal_agents.sandbox``: build the sandbox image, run code in a sandbox, check set-up.

Usage::

    python -m areal_agents.sandbox build [--if-missing] [--method host|dockerfile] [--image NAME]
    python -m areal_agents.sandbox run -c 'print(1+1)' [--backend auto] [--timeout 10]
    python -m areal_agents.sandbox run solution.py
    python -m areal_agents.sandbox doctor
    python -m areal_agents.sandbox cleanup      # remove containers whose owning process died

``run`` prints the program's stdout and stderr and exits with its exit code (124 on timeout).
``doctor`` says, for each backend, whether it works here and if not, why.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from areal_agents.errors import AgentsError

__all__ = ["main"]


def _build(args: argparse.Namespace) -> int:
    import logging

    from areal_agents.sandboxes.image import build_image

    # the image module says whether the image a rebuild replaced was removed or kept
    logging.basicConfig(format="%(message)s")
    logging.getLogger("areal_agents.sandboxes.image").setLevel(logging.INFO)

    start = time.monotonic()
    name, built = build_image(args.image, method=args.method, if_missing=args.if_missing)
    took = time.monotonic() - start
    print(f"sandbox image {name}: {'built' if built else 'already present'} ({took:.1f} s)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from areal_agents.sandboxes import make_sandbox

    if args.code is None and args.file is None:
        print("run: give -c CODE or a FILE", file=sys.stderr)
        return 2
    code = args.code if args.code is not None else Path(args.file).read_text()
    limits = {"memory_mb": args.memory_mb} if args.memory_mb else {}
    with make_sandbox(args.backend, image=args.image, pool_size=0, **limits) as sb:
        result = sb.run_python(code, timeout=args.timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.truncated:
        print("[output truncated]", file=sys.stderr)
    if result.timed_out:
        print(f"[timed out after {args.timeout} s]", file=sys.stderr)
        return 124
    if result.oom_killed:
        print("[killed: out of memory]", file=sys.stderr)
    return result.exit_code


def _doctor(args: argparse.Namespace) -> int:
    from areal_agents.sandboxes import backend_problems, pick_backend
    from areal_agents.sandboxes.image import default_image

    image = args.image or default_image()
    problems = backend_problems(image)
    for name, problem in problems.items():
        verdict = "ok" if problem is None else f"unavailable: {problem}"
        print(f"{name:11s} {verdict}")
    if problems["docker"] is None:
        from areal_agents.sandboxes.docker_pool import docker_client, owned_containers

        client = docker_client()
        info = client.version()
        print(f"docker engine {info.get('Version')} (API {info.get('ApiVersion')}), image {image}")
        print(f"labelled sandbox containers running now: {len(owned_containers(client))}")
    print(f"backend='auto' picks: {pick_backend(image)}")
    if problems["process"] is None and all(problems[b] for b in ("docker", "bubblewrap")):
        print("WARNING: only the process backend works here, and it is not isolation")
    return 0 if problems["docker"] is None or problems["bubblewrap"] is None else 1


def _cleanup(args: argparse.Namespace) -> int:
    from areal_agents.sandboxes.docker_pool import reap_orphans

    print(f"removed {reap_orphans()} container(s) whose owning process is gone")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m areal_agents.sandbox`` and the ``areal-sandbox`` script."""
    parser = argparse.ArgumentParser(prog="areal-sandbox", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    image_help = "image name; None: $AREAL_SANDBOX_IMAGE, else areal-agents-sandbox:latest"
    defaults = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser(
        "build",
        help="build the sandbox image (offline by default)",
        description="Build the sandbox image; a rebuild removes the image it replaced unless a "
        "container still uses it.",
        formatter_class=defaults,
    )
    p.add_argument("--image", help=image_help)
    p.add_argument(
        "--method",
        choices=["host", "dockerfile"],
        default="host",
        help="host: from this machine's own packages, offline; dockerfile: docker build (pulls "
        "a base image)",
    )
    p.add_argument("--if-missing", action="store_true", help="do nothing if the image exists")
    p.set_defaults(func=_build)

    p = sub.add_parser(
        "run",
        help="run a Python snippet or file in a sandbox",
        description="Run Python code in a sandbox; prints its output and exits with its exit "
        "code (124 on timeout).",
        formatter_class=defaults,
    )
    p.add_argument("file", nargs="?", help="a Python file to run")
    p.add_argument("-c", dest="code", help="Python source to run")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "docker", "bubblewrap", "process"],
        help="auto picks docker, then bubblewrap, then a plain process (not isolation)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before the run is killed")
    p.add_argument(
        "--memory-mb", type=int, default=0, help="memory limit in MiB (0: the backend's default)"
    )
    p.add_argument("--image", help=image_help)
    p.set_defaults(func=_run)

    p = sub.add_parser(
        "doctor",
        help="report which sandbox backends work here, and why not",
        formatter_class=defaults,
    )
    p.add_argument("--image", help=image_help)
    p.set_defaults(func=_doctor)

    p = sub.add_parser("cleanup", help="remove sandbox containers left by dead processes")
    p.set_defaults(func=_cleanup)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except AgentsError as e:
        print(f"areal-sandbox {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
