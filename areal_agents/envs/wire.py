"""The wire format of the environment server: JSON for values, spaces and assistant turns.

Both ends of ``python -m areal_agents.envs.serve`` and :class:`~areal_agents.envs.remote.RemoteEnv`
use these functions, so what a remote environment returns is what the local one returned:

* values (observations, infos, actions) travel as plain JSON; numpy scalars and arrays become
  numbers and nested lists (:func:`jsonable`), and :func:`decode_value` turns them back into the
  types the space holds (an ``np.ndarray`` of the space's dtype for a ``Box``, ``np.int64`` for a
  ``Discrete``, ...). Chat observations are lists of dicts and need no conversion;
* spaces travel as small dicts (:func:`space_to_dict` / :func:`space_from_dict`): every standard
  Gymnasium space, and this package's :class:`~areal_agents.envs.spaces.MessagesSpace` and
  :class:`~areal_agents.envs.spaces.TurnSpace`. A space of another kind arrives as an
  :class:`OpaqueSpace` that accepts any value and cannot sample;
* an assistant :class:`~areal_agents.types.Turn` travels as a dict (:func:`turn_to_dict`), so
  that a turn whose tool calls the endpoint already parsed stays distinct from plain text.

Non-finite floats are written as Python's ``json`` writes them (``NaN``, ``Infinity``); lone
surrogates in strings as ``\\uXXXX`` escapes (:func:`dumps` never fails on text).

>>> from gymnasium.spaces import Box
>>> box = space_from_dict(space_to_dict(Box(0.0, 1.0, shape=(2,))))
>>> box.shape, str(box.dtype)
((2,), 'float32')
>>> decode_value(box, [0.5, 1.0])
array([0.5, 1. ], dtype=float32)
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np
from gymnasium import spaces

from areal_agents.envs.spaces import MessagesSpace, TurnSpace
from areal_agents.files import json_text
from areal_agents.types import ToolCall, Turn

__all__ = [
    "API_KEY_ENV",
    "PROTOCOL_VERSION",
    "OpaqueSpace",
    "decode_value",
    "dumps",
    "jsonable",
    "resolve_api_key",
    "space_from_dict",
    "space_to_dict",
    "turn_from_dict",
    "turn_to_dict",
]

logger = logging.getLogger(__name__)

#: Bumped when a request or response changes incompatibly; ``/health`` reports it.
PROTOCOL_VERSION = 1

#: The environment variable that holds the server's API key, at both ends: the server reads it
#: when ``--api-key`` is not given, :class:`~areal_agents.envs.remote.RemoteEnv` sends it.
API_KEY_ENV = "AREAL_ENV_API_KEY"


def resolve_api_key(given: str | None) -> str | None:
    """The key a server or client uses: ``given``, else :data:`API_KEY_ENV`; None when empty."""
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    return key or None


def jsonable(value: Any) -> Any:
    """``json.dumps``'s ``default=``: numpy values, sets, paths, bytes and dataclasses as JSON.

    Anything else becomes its ``repr`` (with a warning), so that a strange value in an info
    dict never fails the request it belongs to.
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    logger.warning("sending %s as its repr: it is not JSON-serialisable", type(value).__name__)
    return repr(value)


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (see :func:`jsonable` for the non-JSON types).

    Any text can be sent: a lone surrogate (a test's message, a model's output) travels as its
    ``\\uXXXX`` escape and arrives as the same string (:func:`areal_agents.files.json_text`).
    """
    return json_text(value, separators=(",", ":"), default=jsonable).encode()


# ---- spaces --------------------------------------------------------------------------------


class OpaqueSpace(spaces.Space[Any]):
    """A space the wire format cannot describe: contains any value, cannot sample.

    ``description`` is the server's ``repr`` of the real space.
    """

    def __init__(self, description: str = "") -> None:
        self.description = description
        super().__init__(shape=None, dtype=None)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        raise NotImplementedError(
            f"cannot sample the remote space {self.description}: its type has no wire format"
        )

    def __repr__(self) -> str:
        return f"OpaqueSpace({self.description})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueSpace) and other.description == self.description

    def __hash__(self) -> int:
        return hash(("OpaqueSpace", self.description))


def _array(values: np.ndarray) -> Any:
    """An array bound as a scalar when all entries are equal, else a nested list; non-finite
    numbers as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (plain JSON has none)."""
    flat = values.ravel()
    if flat.size and bool(np.all(flat == flat[0])):
        return _number(flat[0])
    return np.vectorize(_number, otypes=[object])(values).tolist() if flat.size else []


def _number(x: Any) -> Any:
    value = x.item() if isinstance(x, np.generic) else x
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def space_to_dict(space: spaces.Space[Any]) -> dict[str, Any]:
    """A JSON-able description of ``space`` (see :func:`space_from_dict`)."""
    if isinstance(space, MessagesSpace):
        return {"type": "MessagesSpace", "max_messages": space.max_messages}
    if isinstance(space, TurnSpace):
        return {
            "type": "TurnSpace",
            "tool_names": list(space.tool_names),
            "max_length": space.max_length,
        }
    if isinstance(space, spaces.Discrete):
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": _array(space.low),
            "high": _array(space.high),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "max_length": space.max_length,
            "min_length": space.min_length,
            "charset": "".join(sorted(space.character_set)),
        }
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    if isinstance(space, spaces.Sequence):
        return {
            "type": "Sequence",
            "space": space_to_dict(space.feature_space),
            "stack": bool(space.stack),
        }
    return {"type": "Opaque", "repr": repr(space)}


def _bound(raw: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    # floats go through float64 so that "inf"/"nan" strings parse; integers stay exact
    parsed = np.asarray(raw, dtype=np.float64 if dtype.kind == "f" else dtype)
    return np.broadcast_to(parsed, shape).astype(dtype)


def space_from_dict(data: Mapping[str, Any]) -> spaces.Space[Any]:
    """The space that :func:`space_to_dict` described."""
    kind = data.get("type")
    if kind == "MessagesSpace":
        return MessagesSpace(max_messages=int(data["max_messages"]))
    if kind == "TurnSpace":
        return TurnSpace(tool_names=data["tool_names"], max_length=int(data["max_length"]))
    if kind == "Discrete":
        return spaces.Discrete(int(data["n"]), start=int(data["start"]), dtype=data["dtype"])
    if kind == "Box":
        dtype, shape = np.dtype(data["dtype"]), tuple(data["shape"])
        return spaces.Box(
            _bound(data["low"], shape, dtype),
            _bound(data["high"], shape, dtype),
            shape=shape,
            dtype=dtype.type,
        )
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(
            np.asarray(data["nvec"]), dtype=data["dtype"], start=np.asarray(data["start"])
        )
    if kind == "MultiBinary":
        return spaces.MultiBinary(data["n"])
    if kind == "Text":
        return spaces.Text(
            int(data["max_length"]), min_length=int(data["min_length"]), charset=data["charset"]
        )
    if kind == "Dict":
        return spaces.Dict(
            {k: space_from_dict(s) for k, s in data["spaces"].items()}, sort_keys=False
        )
    if kind == "Tuple":
        return spaces.Tuple([space_from_dict(s) for s in data["spaces"]])
    if kind == "Sequence":
        return spaces.Sequence(space_from_dict(data["space"]), stack=bool(data["stack"]))
    return OpaqueSpace(str(data.get("repr", kind)))


def decode_value(space: spaces.Space[Any], value: Any) -> Any:
    """``value`` (parsed JSON) as the Python type ``space`` holds.

    Spaces of chat messages, turns and opaque spaces take the JSON value as it is.
    """
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        array = np.asarray(value, dtype=space.dtype)
        return array.reshape(space.shape) if space.shape else array
    if isinstance(space, spaces.Discrete):
        return np.asarray(value, dtype=space.dtype)[()]
    if isinstance(space, spaces.Dict) and isinstance(value, Mapping):
        return {k: decode_value(space.spaces[k], v) if k in space.spaces else v
                for k, v in value.items()}  # fmt: skip
    if isinstance(space, spaces.Tuple) and isinstance(value, list):
        return tuple(decode_value(s, v) for s, v in zip(space.spaces, value, strict=False))
    if isinstance(space, spaces.Sequence) and isinstance(value, list):
        items = [decode_value(space.feature_space, v) for v in value]
        return np.stack(items) if space.stack and items else tuple(items)
    return value


# ---- assistant turns -----------------------------------------------------------------------


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    """An assistant turn as JSON: what an environment reads (text, tool calls) and the turn's
    name. Token ids, log-probs and versions stay with the client that sampled them."""
    return {
        "text": turn.text,
        "tool_calls": None
        if turn.tool_calls is None
        else [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in turn.tool_calls],
        "id": turn.id,
        "finish_reason": turn.finish_reason,
        "usage": None if turn.usage is None else dict(turn.usage),
    }


def turn_from_dict(data: Mapping[str, Any]) -> Turn:
    """The :class:`~areal_agents.types.Turn` of :func:`turn_to_dict`; ``ValueError`` on a
    malformed dict."""
    if not isinstance(data.get("text"), str):
        raise ValueError("a turn needs 'text', a string")
    calls = data.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ValueError("'tool_calls' must be a list or null")

    return Turn(
        text=data["text"],
        tool_calls=None
        if calls is None
        else tuple(
            ToolCall(str(c["name"]), str(c.get("arguments", "{}")), str(c.get("id", "")))
            for c in calls
        ),
        id=str(data.get("id", "")),
        finish_reason=data.get("finish_reason"),
        usage=data.get("usage"),
    )
