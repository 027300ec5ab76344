"""``layout.json`` of a graph archive: the graph's layout as checked JSON, and back.

:mod:`jointlab.io.persist` writes and reads the archive; this module turns a
graph's layout into ``layout.json``'s document and back: mode, state and input
specs (the input treespec through ``torch.utils._pytree.treespec_dumps``),
parameter names, loss_dict keys, dynamic dims, the shape guards as sympy
expression trees, the recorded assumptions, the AOT runtime plan and, for a
graph with collectives, its world (:mod:`jointlab.io.world_record`).
Everything read is checked; anything malformed raises :class:`PersistError`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from jointlab.assumptions import KINDS, Assumption, Assumptions
from jointlab.core import GraphParts, TracedGraph
from jointlab.errors import PersistError
from jointlab.inputs import InputSpec, LeafSpec, StateSpec
from jointlab.io.codec import (
    decode_device,
    decode_dtype,
    decode_sympy,
    decode_value,
    encode_sympy,
    encode_value,
)
from jointlab.io.world_record import decode_world, encode_world
from jointlab.runtime.dtensor import AotDTensorRuntime, DTensorRuntime
from jointlab.runtime.plans import AotRuntime, MakeFxRuntime
from jointlab.runtime.saved_world import WorldRuntime
from jointlab.shape_guards import ShapeGuards
from jointlab.torch_compat import pytree


def encode_layout(joint: TracedGraph) -> dict[str, Any]:
    """``layout.json``'s document for ``joint``.

    Args:
        joint: The graph being saved.

    Returns:
        The JSON-safe document (``world`` only for a graph with collectives or DTensor state).

    Raises:
        PersistError: An input value, assumption, runtime or world that cannot be stored.
    """
    s, i = joint.state_spec, joint.input_spec
    leaves = [{
        "path": leaf.path, "is_tensor": leaf.is_tensor, "shape": list(leaf.shape),
        "dtype": str(leaf.dtype).removeprefix("torch.") if leaf.dtype else None,
        "device": str(leaf.device) if leaf.device is not None else None,
        "value": encode_value(leaf.value, f"input '{leaf.path}'"),
        **({"requires_grad": True} if leaf.requires_grad else {}),  # version 4's keys
        **({"state_alias": leaf.state_alias} if leaf.state_alias else {}),
        **({"input_alias": leaf.input_alias} if leaf.input_alias else {}),
    } for leaf in i.leaves]
    return {
        "mode": joint.mode,
        "state": {"fqns": list(s.fqns), "shapes": [list(x) for x in s.shapes],
                  "dtypes": [str(d).removeprefix("torch.") for d in s.dtypes],
                  "devices": [str(d) for d in s.devices], "is_param": list(s.is_param)},
        "inputs": {"treespec": pytree.treespec_dumps(i.treespec), "leaves": leaves},
        "param_names": list(joint.param_names),
        "loss_dict_keys": list(joint.loss_dict_keys),
        "dynamic_dims": {p: sorted(d) for p, d in joint.dynamic_dims.items()},
        "guards": (_encode_guards(joint.shape_guards) if joint.shape_guards is not None
                   else None),
        "assumptions": _encode_assumptions(joint.assumptions),
        "runtime": _encode_runtime(joint),
        **encode_world(joint),
    }


def _encode_assumptions(a: Assumptions) -> list[list[Any]] | None:
    """The recorded facts as rows; None for a graph that never had them recorded."""
    if not a.recorded:
        return None
    return [[f.kind, f.target, f.attr, encode_value(f.value, f"assumption {f.target}.{f.attr}"),
             f.source, *([list(f.ranks)] if f.ranks is not None else [])] for f in a.facts]


def _decode_assumptions(rows: Any) -> Assumptions:
    """The facts of an archive; an older archive without them records nothing."""
    if rows is None:
        return Assumptions(recorded=False)
    facts = []
    for row in rows:  # a rank fact has a sixth entry: the ranks that read the same value
        if len(row) not in (5, 6) or row[0] not in KINDS or (row[0] == "rank") != (len(row) == 6):
            raise PersistError(f"malformed assumption {row!r} in the archive")
        kind, target, attr, value, source = row[:5]
        ranks = tuple(int(r) for r in row[5]) if len(row) == 6 else None
        facts.append(Assumption(str(kind), str(target), str(attr), decode_value(value),
                                str(source), ranks))
    return Assumptions(tuple(facts))


def _plain_plan(runtime: Any) -> Any:
    """The mode's plain-data plan under a DTensor or loaded-world runtime (its world apart)."""
    if isinstance(runtime, (WorldRuntime, AotDTensorRuntime)):
        return runtime.plan
    if type(runtime) is DTensorRuntime:
        return MakeFxRuntime()
    return runtime


def _encode_runtime(joint: TracedGraph) -> Any:
    """The runtime's plain-data plan: None for make_fx, the field dict for AOT."""
    plan = _plain_plan(joint.runtime)
    if joint.mode == "make_fx" and type(plan) is MakeFxRuntime:
        return None
    if joint.mode == "aot" and type(plan) is AotRuntime:
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(AotRuntime)}
        return encode_value(fields, "the AOT runtime")
    raise PersistError(f"cannot save a mode={joint.mode!r} graph with runtime "
                       f"{type(joint.runtime).__name__}")


def _decode_runtime(mode: str, data: Any) -> Any:
    if mode == "make_fx":
        if data is not None:
            raise PersistError("a make_fx archive must not carry a runtime plan")
        return None
    fields = decode_value(data)
    names = {f.name for f in dataclasses.fields(AotRuntime)}
    if not isinstance(fields, dict) or set(fields) != names:
        raise PersistError(f"malformed AOT runtime plan: expected fields {sorted(names)}")
    plan_ok = all(i is None or isinstance(i, int) for i in fields["arg_plan"]) and all(
        isinstance(k, str) and isinstance(i, int) for k, i in fields["out_plan"])
    if not plan_ok or not isinstance(fields["tangent_dtype"], torch.dtype):
        raise PersistError("malformed AOT runtime plan")
    fields["out_plan"] = [tuple(x) for x in fields["out_plan"]]
    fields["tangent_shape"] = tuple(fields["tangent_shape"])
    return AotRuntime(**fields)


def _encode_guards(g: ShapeGuards) -> dict[str, Any]:
    return {
        "dims": {p: [encode_sympy(e) for e in exprs] for p, exprs in g.dims.items()},
        "traced_sizes": {p: list(s) for p, s in g.traced_sizes.items()},
        "dynamic_dims": {p: sorted(d) for p, d in g.dynamic_dims.items()},
        "ranges": [[encode_sympy(s), encode_sympy(lo), encode_sympy(hi)]
                   for s, (lo, hi) in g.ranges.items()],
        "guards": [[encode_sympy(e), str(sloc)] for e, sloc in g.guards],
    }


def _decode_guards(d: dict[str, Any]) -> ShapeGuards:
    try:
        return ShapeGuards(
            dims={str(p): tuple(decode_sympy(e) for e in exprs) for p, exprs in d["dims"].items()},
            traced_sizes={str(p): tuple(int(x) for x in s) for p, s in d["traced_sizes"].items()},
            dynamic_dims={str(p): {int(x) for x in s} for p, s in d["dynamic_dims"].items()},
            ranges={decode_sympy(s): (decode_sympy(lo), decode_sympy(hi))
                    for s, lo, hi in d["ranges"]},
            guards=[(decode_sympy(e), str(sloc)) for e, sloc in d["guards"]],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, PersistError):
            raise
        raise PersistError(f"malformed shape guards in the archive: {exc}") from exc


def decode_layout(d: Any, gm: fx.GraphModule) -> GraphParts:
    """The parts of a graph: ``gm`` with the layout ``layout.json`` holds.

    Args:
        d: ``layout.json``'s document, as read (checked here).
        gm: The graph module decoded from ``graph.json``.

    Returns:
        The graph's parts, its runtime plan included.

    Raises:
        PersistError: ``d`` is malformed or names an unsupported mode.
    """
    try:
        if d["mode"] not in ("make_fx", "aot"):
            raise PersistError(f"unsupported mode {d['mode']!r} in the archive")
        s = d["state"]
        state = StateSpec(
            tuple(str(f) for f in s["fqns"]),
            tuple(tuple(int(x) for x in sh) for sh in s["shapes"]),
            tuple(decode_dtype(x) for x in s["dtypes"]),
            tuple(decode_device(x) for x in s["devices"]),
            tuple(bool(x) for x in s["is_param"]))
        leaves = tuple(
            LeafSpec(str(lf["path"]), bool(lf["is_tensor"]), tuple(int(x) for x in lf["shape"]),
                     decode_dtype(lf["dtype"]) if lf["dtype"] else None,
                     decode_device(lf["device"]) if lf["device"] else None,
                     decode_value(lf["value"]), bool(lf.get("requires_grad", False)),
                     str(lf.get("state_alias", "")), str(lf.get("input_alias", "")))
            for lf in d["inputs"]["leaves"])
        treespec = pytree.treespec_loads(str(d["inputs"]["treespec"]))
        runtime = _decode_runtime(d["mode"], d.get("runtime"))
        if d.get("world") is not None:
            runtime = WorldRuntime(decode_world(d["world"]), runtime or MakeFxRuntime())
        return GraphParts(
            gm, mode=d["mode"], runtime=runtime,
            state_spec=state, input_spec=InputSpec(treespec, leaves),
            param_names=[str(x) for x in d["param_names"]],
            loss_dict_keys=[str(x) for x in d["loss_dict_keys"]],
            dynamic_dims={str(p): {int(x) for x in v} for p, v in d["dynamic_dims"].items()},
            shape_guards=_decode_guards(d["guards"]) if d["guards"] is not None else None,
            assumptions=_decode_assumptions(d.get("assumptions")),
        )
    except PersistError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, NotImplementedError) as exc:
        raise PersistError(f"malformed layout.json in the archive: {exc!r}") from exc
