"""The weight version a response was generated under, read from the response itself.

A token's version must come from the server that generated it, not from a read the client makes
when the response arrives: a weight update can finish in between, and staleness accounting
would then count old tokens as new. Both inference servers (the built-in one, and vLLM through
:mod:`areal_agents.serving.version_headers`) send two headers with every response:

* ``X-Weight-Version-Start`` — the version served when the request arrived;
* ``X-Weight-Version`` — the version served when the response began (for a non-streaming
  request: after the generation ended).

A generation that overlapped an update has ``start < end``; :func:`response_version` tags its
tokens with the older one, so they are never counted fresher than they are. A server that knows
the exact version of a response's tokens puts it in the body (``weight_version``: the built-in
server, whose updates wait for running generations to stop); that one wins.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["END_HEADER", "START_HEADER", "parse_version", "response_version"]

START_HEADER = "X-Weight-Version-Start"
END_HEADER = "X-Weight-Version"


def parse_version(value: object) -> int | None:
    """A version as an int (vLLM keeps it as a string, ``"default"`` before any update: 0);
    None for a missing or unreadable one."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    return 0 if text == "default" else None


def response_version(headers: Mapping[str, str], body_version: object = None) -> int | None:
    """The version to tag a response's tokens with: ``body_version`` (the body's
    ``weight_version``) if the server sent one, else the older of the two headers.

    ``headers``: the response's headers (any case). None when the response reports no version.
    """
    exact = parse_version(body_version)
    if exact is not None:
        return exact
    lowered = {k.lower(): v for k, v in headers.items()}
    found = [parse_version(lowered.get(name.lower())) for name in (START_HEADER, END_HEADER)]
    versions = [v for v in found if v is not None]
    return min(versions) if versions else None
