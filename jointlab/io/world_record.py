"""A graph's world in an archive (format version 5): :class:`SavedWorld` as checked JSON.

:mod:`jointlab.io.persist` writes ``layout.json``'s ``world`` for a graph with
functional collectives or DTensor state, and reads it back into the
:class:`~jointlab.runtime.saved_world.SavedWorld` a loaded graph's
:class:`~jointlab.runtime.saved_world.WorldRuntime` checks before running.
Every field is validated on load; nothing is evaluated.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from jointlab.errors import PersistError, StateMismatchError
from jointlab.io.codec import decode_value, encode_value
from jointlab.runtime.saved_world import SHARD_KEYS, SavedWorld

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["decode_world", "encode_world"]


def encode_world(joint: TracedGraph) -> dict[str, Any]:
    """``{"world": ...}`` for a graph with collectives or DTensor state, else nothing.

    Raises:
        PersistError: It has collectives and no process group says which ranks they hold.
    """
    try:
        world = SavedWorld.of(joint.graph_module, joint.runtime)
    except StateMismatchError as exc:
        raise PersistError(f"cannot save this graph: {exc} Nothing was written.") from exc
    if world is None:
        return {}
    return {"world": encode_value(dataclasses.asdict(world), "the graph's world")}


def _facts(d: Any, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(d, dict) or set(d) != keys:
        raise PersistError(f"malformed {what} in the archive's world: expected {sorted(keys)}")
    return d


def decode_world(data: Any) -> SavedWorld:
    """The :class:`SavedWorld` of an archive's ``world`` entry.

    Raises:
        PersistError: A field is missing, extra or of the wrong type.
    """
    d = _facts(decode_value(data), {f.name for f in dataclasses.fields(SavedWorld)}, "fields")
    groups, classes = d["groups"], d["rank_classes"]
    if not isinstance(d["world_size"], int) or not isinstance(groups, dict) or not all(
            isinstance(n, str) and isinstance(r, (list, tuple)) for n, r in groups.items()):
        raise PersistError("malformed world size or process groups in the archive's world")
    shard = set(SHARD_KEYS)
    state = [None if s is None else _facts(s, {"fqn", *shard}, "DTensor input")
             for s in d["state"]]
    grads = {str(n): _facts(g, shard, "DTensor gradient") for n, g in d["grads"].items()}
    return SavedWorld(
        d["world_size"], {n: tuple(int(x) for x in r) for n, r in groups.items()},
        {str(k): str(v) for k, v in d["group_dims"].items()},
        None if classes is None else tuple(tuple(int(x) for x in c) for c in classes),
        state, grads)
