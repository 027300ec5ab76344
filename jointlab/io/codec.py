"""Pickle-free encoding of graph values, op targets and sympy expressions as JSON.

:mod:`jointlab.io.persist` stores a joint graph as data. Everything that is not
a plain JSON scalar is written as a tagged object ``{"t": tag, "v": value}``
(a dict with string keys as ``{"t": "sdict", "v": {...}}`` since format
version 2, ``"dict"`` pairs otherwise) and read back only through the fixed
decoders below: dtypes, devices, memory
formats and layouts by name, operator targets by qualified name against an
allow-list, and sympy expressions as a tree of allow-listed constructors.
Nothing read from a file is ever imported, evaluated or unpickled.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx as fx

from jointlab.errors import PersistError
from jointlab.runtime.custom_ops import GET_STATE, MKLDNN_RNN_LAYER, SET_STATE
from jointlab.torch_compat import FUNCTIONAL_COLLECTIVES, int_oo, is_op_overload, op_parts
from jointlab.torch_compat import sympy_functions as sym_fns

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A dotted name of identifiers (``fullmatch`` it: one regex call a name, a load checks thousands).
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
DEVICE = re.compile(r"^[a-z_]+(:[0-9]+)?$")
#: Op namespaces a saved graph may call: ATen, prims and torch's functional collectives
#: (a graph of one rank of a distributed job; loaded, it runs only in its world).
OP_NAMESPACES = ("aten", "prims", FUNCTIONAL_COLLECTIVES)

# Non-ATen call targets a joint graph may hold (multi-output access and the
# SymInt arithmetic of dynamic shapes), by the name written to the file.
SAFE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    f"operator.{name}": getattr(operator, name)
    for name in ("getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg",
                 "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_",
                 "invert", "lshift", "rshift")
}
SAFE_FUNCTIONS.update({f"math.{n}": getattr(math, n) for n in ("ceil", "floor", "trunc", "sqrt")})
SAFE_FUNCTIONS.update({
    f"torch.{n}": getattr(torch, n)
    for n in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum",
              "_sym_sqrt")
    if hasattr(torch, n)
})
# Gradient checkpointing's generator-state replay (jointlab.runtime.custom_ops) and
# the oneDNN RNN layer that keeps its workspace under no_grad (same module).
SAFE_FUNCTIONS.update({f"torch.ops.jointlab.{op_parts(op)[1]}.default": op
                       for op in (GET_STATE, SET_STATE, MKLDNN_RNN_LAYER)})
_FUNCTION_NAMES = {id(fn): name for name, fn in SAFE_FUNCTIONS.items()}
# Op names already resolved and checked by decode_callable (a load decodes thousands).
_RESOLVED: dict[str, Callable[..., Any]] = {}


# -- operator targets -----------------------------------------------------------
def encode_target(node: fx.Node) -> Any:
    """Name ``node``'s target, refusing anything outside the allow-list.

    Raises:
        PersistError: The target is not an ATen/prims op or an allow-listed function.
    """
    if node.op in ("placeholder", "get_attr", "output"):
        return node.target
    if node.op != "call_function":
        raise PersistError(f"node '{node.name}' is a {node.op}; only call_function nodes "
                           "can be saved.")
    return encode_callable(node.target, f"node '{node.name}'")


def encode_callable(fn: Any, where: str) -> str:
    """Qualified name of an op overload or allow-listed function."""
    if is_op_overload(fn) and fn.namespace in OP_NAMESPACES:
        return "torch.ops." + ".".join(op_parts(fn))
    name = _FUNCTION_NAMES.get(id(fn))
    if name is None:
        raise PersistError(f"{where} calls {fn!r}, which jointlab cannot save safely (only "
                           f"{'/'.join(OP_NAMESPACES)} ops and basic SymInt arithmetic).")
    return name


def decode_callable(name: Any) -> Callable[..., Any]:
    """Resolve a saved target name against the allow-list only.

    Raises:
        PersistError: The name is not an allow-listed op or function.
    """
    if not isinstance(name, str):
        raise PersistError(f"a node target must be a string, got {type(name).__name__}")
    if name in SAFE_FUNCTIONS:
        return SAFE_FUNCTIONS[name]
    if name in _RESOLVED:  # only names that passed the checks below get here
        return _RESOLVED[name]
    parts = name.split(".")
    if (len(parts) != 5 or parts[:2] != ["torch", "ops"] or parts[2] not in OP_NAMESPACES
            or not all(IDENT.match(p) and not p.startswith("__") for p in parts[3:])):
        raise PersistError(f"refusing to load target {name!r}: it is not on jointlab's "
                           "allow-list (torch.ops.aten/prims overloads, operator.getitem "
                           "and SymInt arithmetic). The file may have been tampered with.")
    ns, opname, overload = parts[2:]
    try:
        fn = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    except (AttributeError, RuntimeError) as exc:
        raise PersistError(f"target {name!r} does not exist in this torch build") from exc
    if not is_op_overload(fn):
        raise PersistError(f"target {name!r} is not an operator overload")
    _RESOLVED[name] = fn
    return fn


# -- values -----------------------------------------------------------------------
def encode_value(v: Any, where: str) -> Any:
    """Encode an argument or meta value as JSON (node refs by name).

    Raises:
        PersistError: A value of a type jointlab does not store.
    """
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"t": "float", "v": repr(v)}
    if isinstance(v, fx.Node):
        return {"t": "node", "v": v.name}
    if isinstance(v, list):
        return [encode_value(x, where) for x in v]
    if isinstance(v, tuple):
        return {"t": "tuple", "v": [encode_value(x, where) for x in v]}
    if isinstance(v, dict):
        if all(type(k) is str for k in v):  # format version 2: a JSON object
            return {"t": "sdict", "v": {k: encode_value(x, where) for k, x in v.items()}}
        return {"t": "dict", "v": [[encode_value(k, where), encode_value(x, where)]
                                   for k, x in v.items()]}
    if isinstance(v, torch.dtype):
        return {"t": "dtype", "v": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"t": "device", "v": str(v)}
    if isinstance(v, torch.memory_format):
        return {"t": "memory_format", "v": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"t": "layout", "v": str(v).removeprefix("torch.")}
    if isinstance(v, slice):
        return {"t": "slice", "v": [encode_value(x, where) for x in (v.start, v.stop, v.step)]}
    if is_op_overload(v):
        return {"t": "op", "v": encode_callable(v, where)}
    raise PersistError(f"{where} holds a {type(v).__module__}.{type(v).__qualname__}, which "
                       "jointlab cannot save without pickle.")


def _torch_attr(name: Any, kind: type) -> Any:
    if not isinstance(name, str) or not IDENT.match(name) or name.startswith("_"):
        raise PersistError(f"invalid {kind.__name__} name {name!r}")
    val = getattr(torch, name, None)
    if not isinstance(val, kind):
        raise PersistError(f"{name!r} is not a torch.{kind.__name__}")
    return val


def decode_device(s: Any) -> torch.device:
    """Parse a device string like ``cpu`` or ``cuda:0``."""
    if not isinstance(s, str) or not DEVICE.match(s):
        raise PersistError(f"invalid device {s!r}")
    return torch.device(s)


def decode_dtype(s: Any) -> torch.dtype:
    """Resolve a dtype by name (``float32``)."""
    return _torch_attr(s, torch.dtype)


_DECODERS: dict[str, Callable[[Any, Callable[[str], Any] | None], Any]] = {
    "float": lambda v, _: float(v) if isinstance(v, str) else _bad("float", v),
    "dtype": lambda v, _: decode_dtype(v),
    "device": lambda v, _: decode_device(v),
    "memory_format": lambda v, _: _torch_attr(v, torch.memory_format),
    "layout": lambda v, _: _torch_attr(v, torch.layout),
    "op": lambda v, _: decode_callable(v),
}


def _bad(tag: str, v: Any) -> Any:
    raise PersistError(f"malformed {tag} value {v!r}")


# JSON values that decode to themselves (checked inline: a load decodes ~30 a node).
_PLAIN = frozenset({str, int, bool, type(None)})


def decode_value(v: Any, node_of: Callable[[str], Any] | None = None) -> Any:
    """Inverse of :func:`encode_value`; ``node_of`` maps node names to nodes.

    Raises:
        PersistError: An unknown tag or a malformed value.
    """
    kind = type(v)
    if kind in _PLAIN:
        return v
    if kind is list:
        return [x if type(x) in _PLAIN else decode_value(x, node_of) for x in v]
    if kind is not dict or len(v) != 2 or "t" not in v or "v" not in v:
        if isinstance(v, (bool, int, str)):  # subclasses a JSON parser does not make
            return v
        raise PersistError(f"malformed value {v!r}")
    tag, body = v["t"], v["v"]
    if tag == "tuple":
        return tuple([x if type(x) in _PLAIN else decode_value(x, node_of)
                      for x in _as_list(body)])
    if tag == "sdict":
        if type(body) is not dict:
            raise PersistError(f"malformed sdict value {str(body)[:200]}")
        return {k: x if type(x) in _PLAIN else decode_value(x, node_of) for k, x in body.items()}
    if tag == "dict":
        return {decode_value(k, node_of): decode_value(x, node_of) for k, x in _pairs(body)}
    if tag == "node":
        if node_of is None:
            raise PersistError("a node reference appears where none is allowed")
        return node_of(body)
    if tag == "slice":
        return slice(*(decode_value(x, node_of) for x in _as_list(body)[:3]))
    decoder = _DECODERS.get(tag) if type(tag) is str else None
    if decoder is None:
        raise PersistError(f"unknown value tag {tag!r}")
    return decoder(body, node_of)


def _as_list(body: Any) -> list:
    if not isinstance(body, list):
        raise PersistError(f"expected a list, got {type(body).__name__}")
    return body


def _pairs(body: Any) -> list:
    items = _as_list(body)
    for p in items:
        if type(p) is not list or len(p) != 2:
            raise PersistError("malformed dict entry")
    return items


# -- meta values stored once (format version 2) ---------------------------------
def is_plain_scalar(encoded: Any) -> bool:
    """True for an encoded value that is a JSON scalar (not worth sharing)."""
    return encoded is None or isinstance(encoded, (bool, int))


class SharedValues:
    """Encoded meta values stored once, by index (stack traces repeat across nodes)."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[str, int] = {}

    def index(self, encoded: Any) -> int:
        """The index of ``encoded`` in :attr:`values`, adding it on first sight."""
        key = json.dumps(encoded, sort_keys=True) if not isinstance(encoded, str) else encoded
        if key not in self._index:
            self._index[key] = len(self.values)
            self.values.append(encoded)
        return self._index[key]


def decode_shared(values: Any) -> list[Callable[[], Any]]:
    """Decode graph.json's ``shared`` list (meta values only: no node references).

    Returns:
        For each value, a function returning a fresh copy of it where it is
        mutable (the value itself otherwise), chosen once per value.

    Raises:
        PersistError: It is not a list, or holds a malformed value.
    """
    if not isinstance(values, list):
        raise PersistError("graph.json's shared meta values must be a list")
    return [_copier(decode_value(v)) for v in values]


def _copier(v: Any) -> Callable[[], Any]:
    kind = type(v)
    if kind not in _MUTABLE:
        return lambda: v
    children = v.values() if kind is dict else v
    if any(type(x) in _MUTABLE for x in children):
        return lambda: _fresh(v)
    return v.copy


def shared_meta(refs: Any, shared: list[Callable[[], Any]],
                allowed: tuple[str, ...]) -> dict[str, Any]:
    """A node's shared meta values by key, each a fresh copy where it is mutable.

    Args:
        refs: The node record's ``shared_meta``: meta key -> index into ``shared``.
        shared: What :func:`decode_shared` returned.
        allowed: The meta keys an archive may hold.

    Returns:
        The node's meta entries.

    Raises:
        PersistError: An unexpected key or a missing index.
    """
    if not isinstance(refs, dict):
        raise PersistError("a node's shared_meta must be a JSON object")
    out = {}
    for key, i in refs.items():
        if key not in allowed:
            raise PersistError(f"unexpected node meta key {key!r}")
        if type(i) is not int or not 0 <= i < len(shared):
            raise PersistError(f"node meta {key!r} refers to missing shared value {i!r}")
        out[key] = shared[i]()
    return out


def _fresh(v: Any) -> Any:
    kind = type(v)
    if kind is dict:
        return {k: _fresh(x) if type(x) in _MUTABLE else x for k, x in v.items()}
    if kind is list:
        return [_fresh(x) if type(x) in _MUTABLE else x for x in v]
    return v


_MUTABLE = frozenset({dict, list})  # what decode_value builds that a node must not share


# -- sympy expressions --------------------------------------------------------------
_SYMPY_NAMES = ("Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "floor", "ceiling",
                "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise",
                "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan",
                "GreaterThan")
SYMPY_FUNCTIONS: dict[str, Any] = {n: getattr(sympy, n) for n in _SYMPY_NAMES}
SYMPY_FUNCTIONS.update({
    n: getattr(sym_fns, n) for n in dir(sym_fns)
    if isinstance(getattr(sym_fns, n), type) and issubclass(getattr(sym_fns, n), sympy.Basic)
    and n[0].isupper() and n not in ("Application", "Expr", "LatticeOp", "MinMaxBase", "S")
})
_SYMPY_CONSTANTS = {"int_oo": int_oo, "-int_oo": -int_oo, "oo": sympy.oo, "-oo": -sympy.oo,
                    "true": sympy.true, "false": sympy.false}


def encode_sympy(e: Any) -> Any:
    """Encode a sympy expression as a JSON tree (constructors by name).

    Raises:
        PersistError: The expression uses a function outside the allow-list.
    """
    if isinstance(e, bool):
        return {"const": "true" if e else "false"}
    if isinstance(e, int):
        return {"int": e}
    for name, c in _SYMPY_CONSTANTS.items():
        if e == c and type(e) is type(c):
            return {"const": name}
    if isinstance(e, sympy.Symbol):
        return {"sym": e.name, "assume": {k: v for k, v in e.assumptions0.items()
                                          if isinstance(v, bool)}}
    if isinstance(e, sympy.Integer):
        return {"int": int(e)}
    if isinstance(e, sympy.Rational):
        return {"rat": [int(e.p), int(e.q)]}
    if isinstance(e, sympy.Float):
        return {"float": repr(float(e))}
    name = type(e).__name__
    if SYMPY_FUNCTIONS.get(name) is not type(e):
        raise PersistError(f"cannot save the shape expression {e} ({name} is not allow-listed)")
    return {"fn": name, "args": [encode_sympy(a) for a in e.args]}


def decode_sympy(d: Any) -> Any:
    """Rebuild a sympy expression from :func:`encode_sympy`'s tree.

    Raises:
        PersistError: An unknown constructor or a malformed node.
    """
    if not isinstance(d, dict) or len(d) not in (1, 2):
        raise PersistError(f"malformed shape expression {d!r}")
    if "int" in d and isinstance(d["int"], int):
        return sympy.Integer(d["int"])
    if "const" in d and d["const"] in _SYMPY_CONSTANTS:
        return _SYMPY_CONSTANTS[d["const"]]
    if "rat" in d and isinstance(d["rat"], list) and all(isinstance(x, int) for x in d["rat"]):
        return sympy.Rational(*d["rat"][:2])
    if "float" in d and isinstance(d["float"], str):
        return sympy.Float(float(d["float"]))
    if "sym" in d and isinstance(d["sym"], str) and IDENT.match(d["sym"]):
        assume = d.get("assume", {})
        if not isinstance(assume, dict) or not all(
                IDENT.match(str(k)) and isinstance(v, bool) for k, v in assume.items()):
            raise PersistError(f"malformed symbol assumptions {assume!r}")
        return sympy.Symbol(d["sym"], **assume)
    if "fn" in d and d.get("fn") in SYMPY_FUNCTIONS and isinstance(d.get("args"), list):
        return SYMPY_FUNCTIONS[d["fn"]](*(decode_sympy(a) for a in d["args"]))
    raise PersistError(f"refusing shape expression {d!r}: unknown or not allow-listed")
