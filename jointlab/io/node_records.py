"""One node's record in graph.json: its arguments and meta, encoded and decoded per version.

:mod:`jointlab.io.persist` builds the graph; this module turns a node's
arguments and meta into JSON and back, and nothing else (it writes no
``node.meta``: it returns the dicts persist sets).

Format version 3 (written now) stores ``meta["jointlab"]`` as a row of
values, ``[keys index, value, ...]``, whose key tuple is stored once in
graph.json's ``jl_keys`` (the passes write the same keys in the same order on
most nodes, so a 50k-node graph has about ten), and a node's ``args`` as a
plain JSON list and its ``kwargs`` as a plain JSON object of encoded values.
That halves graph.json and the work of decoding it. Versions 1 and 2 kept
``meta["jointlab"]`` in the record's ``meta`` and tagged the args as a tuple
and the kwargs as a dict; they are still read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

from jointlab import meta as _meta
from jointlab.errors import PersistError
from jointlab.io.codec import (
    IDENT,
    SharedValues,
    decode_value,
    encode_value,
    is_plain_scalar,
    shared_meta,
)

#: Node meta kept besides meta["jointlab"]; values that do not encode are dropped.
SAVED_META = ("seq_nr", "autograd_backward", "is_gradient_acc", "nn_module_stack",
              "stack_trace", "torch_fn", "custom", "original_aten", "desc_repr")
#: The first format version with jointlab meta rows, plain args and kwargs.
ROWS_SINCE = 3

# JSON values that decode to themselves (checked inline: a row holds ~20).
_PLAIN = frozenset({str, int, bool, type(None)})


class KeyTuples:
    """The key tuples of meta["jointlab"] rows, stored once each (graph.json's ``jl_keys``)."""

    def __init__(self) -> None:
        self.values: list[list[str]] = []
        self._index: dict[tuple[str, ...], int] = {}

    def index(self, keys: tuple[str, ...]) -> int:
        """The index of ``keys`` in :attr:`values`, adding it on first sight."""
        if keys not in self._index:
            self._index[keys] = len(self.values)
            self.values.append(list(keys))
        return self._index[keys]


# -- saving -------------------------------------------------------------------------
def encode_args(node: fx.Node, where: str) -> tuple[list[Any], dict[str, Any]]:
    """Version 3's ``args`` (a list of encoded values) and ``kwargs`` (an object of them)."""
    return ([encode_value(a, where) for a in node.args],
            {k: encode_value(v, where) for k, v in node.kwargs.items()})


def encode_node_meta(node: fx.Node, shared: SharedValues, keys: KeyTuples,
                     where: str) -> dict[str, Any]:
    """The record fields holding ``node``'s meta: ``meta``, ``shared_meta`` and ``jl``.

    Args:
        node: The node.
        shared: Meta values stored once for the whole graph.
        keys: The key tuples of the graph's jointlab rows.
        where: The node, for error messages.

    Returns:
        ``{"meta": scalar meta, "shared_meta": key -> shared index, "jl": row or None}``.

    Raises:
        PersistError: meta["jointlab"] holds a value that cannot be stored.
    """
    jl, meta, refs = None, {}, {}
    if _meta.KEY in node.meta:
        ann = node.meta[_meta.KEY]
        jl = [keys.index(tuple(ann)),
              *(encode_value(v, f"meta of {where}") for v in ann.values())]
    for key in SAVED_META:
        if key in node.meta:
            try:
                encoded = encode_value(node.meta[key], where)
            except PersistError:
                continue  # non-essential meta that is not plain data
            if is_plain_scalar(encoded):
                meta[key] = encoded
            else:
                refs[key] = shared.index(encoded)
    return {"meta": meta, "shared_meta": refs, "jl": jl}


# -- loading ------------------------------------------------------------------------
def decode_keys(values: Any) -> list[list[str]]:
    """Check graph.json's ``jl_keys``: a list of lists of strings.

    Raises:
        PersistError: It is malformed.
    """
    if type(values) is not list or not all(
            type(ks) is list and all(type(k) is str for k in ks) for ks in values):
        raise PersistError("graph.json's jl_keys must be lists of strings")
    return values


def decode_args(rec: dict[str, Any], version: int,
                node_of: Callable[[str], fx.Node]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A record's args and kwargs (node references resolved through ``node_of``).

    Raises:
        PersistError: They are malformed, or a keyword is not an identifier.
    """
    if version >= ROWS_SINCE:
        args, kwargs = rec.get("args", []), rec.get("kwargs", {})
        if type(args) is not list or type(kwargs) is not dict:
            raise PersistError(f"node {rec.get('name')!r} has malformed args or kwargs")
        args = tuple(decode_value(args, node_of))
        kwargs = {k: decode_value(v, node_of) for k, v in kwargs.items()}
    else:
        args = decode_value(rec.get("args", []), node_of)
        kwargs = decode_value(rec.get("kwargs", {"t": "dict", "v": []}), node_of)
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
            raise PersistError(f"node {rec.get('name')!r} has malformed args or kwargs")
    if kwargs and not all(type(k) is str and IDENT.fullmatch(k) for k in kwargs):
        raise PersistError(f"node {rec.get('name')!r} has a keyword argument that is not a "
                           "Python identifier (the file may have been tampered with)")
    return tuple(args), kwargs


def decode_meta(rec: dict[str, Any], version: int, shared: list[Callable[[], Any]],
                keys: list[list[str]]) -> dict[str, Any]:
    """A record's node meta: meta["jointlab"], the scalar meta and the shared meta.

    Raises:
        PersistError: An unexpected key, a malformed row or a missing shared value.
    """
    out = _scalar_meta(rec.get("meta", {}), allow_jointlab=version < ROWS_SINCE)
    if version >= ROWS_SINCE and rec.get("jl") is not None:
        out[_meta.KEY] = _decode_row(rec["jl"], keys)
    if _meta.KEY in out and not isinstance(out[_meta.KEY], dict):
        raise PersistError("meta['jointlab'] must be a dict")
    out.update(shared_meta(rec.get("shared_meta", {}), shared, SAVED_META))
    return out


def _scalar_meta(meta: Any, allow_jointlab: bool) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise PersistError("node meta must be a JSON object")
    out = {}
    for key, value in meta.items():
        if key not in SAVED_META and not (allow_jointlab and key == _meta.KEY):
            raise PersistError(f"unexpected node meta key {key!r}")
        out[key] = value if type(value) in _PLAIN else decode_value(value)
    return out


def _decode_row(row: Any, keys: list[list[str]]) -> dict[str, Any]:
    if type(row) is not list or not row or type(row[0]) is not int \
            or not 0 <= row[0] < len(keys) or len(row) != len(keys[row[0]]) + 1:
        raise PersistError(f"malformed meta['jointlab'] row {str(row)[:200]}")
    return dict(zip(keys[row[0]], [v if type(v) in _PLAIN else decode_value(v)
                                   for v in row[1:]]))
