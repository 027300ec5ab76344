"""Descriptor-style queries: one API over both tracing modes.

PyTorch's AOT export describes every placeholder and output with a
descriptor (``meta["desc"]``); its ``fx_utils`` helpers pair inputs with
their gradients and outputs with their tangents. jointlab offers the same
four queries on any :class:`~jointlab.JointGraph`:

- in ``aot`` mode they read the descriptors;
- in ``make_fx`` mode they read jointlab's own trace-time annotations
  (``phase``, ``fqn``, ``grad_of``, ``zero_grad``), since that graph has no
  descriptors.

Both answer with graph nodes, keyed and ordered the same way. With DTensor
state, AOT describes each placeholder as one part of its DTensor
(``SubclassGetAttrAOTInput(base=ParamAOTInput(...), attr='_local_tensor')``)
and each gradient as that part of the gradient; :func:`state_base` reads
through those, so the queries name the DTensor's FQN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.fx as fx

from jointlab.input_grads import graph_input_grads
from jointlab.meta import info
from jointlab.torch_compat import aot_descriptors

D = aot_descriptors()

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

Pair = tuple[fx.Node, "fx.Node | None"]
_INPUT_PHASES = ("param", "buffer", "input")


def _part_kinds() -> tuple[type, ...]:
    return tuple(getattr(D, k) for k in ("SubclassGetAttrAOTInput", "SubclassGetAttrAOTOutput")
                 if hasattr(D, k))


def subclass_base(desc: Any) -> tuple[Any, list[str]]:
    """The descriptor a tensor-subclass part belongs to, and the attributes leading to it.

    Args:
        desc: A placeholder's or output's ``meta["desc"]``.

    Returns:
        ``(outermost non-part descriptor, [attr, ...] outer to inner)``; ``(desc, [])``
        when ``desc`` is not a subclass part.
    """
    attrs: list[str] = []
    kinds = _part_kinds()
    while kinds and isinstance(desc, kinds):
        attrs.insert(0, desc.attr)
        desc = desc.base
    return desc, attrs


def is_state_or_grad(desc: Any) -> bool:
    """True for a parameter, buffer, gradient or state-mutation descriptor."""
    return isinstance(desc, (D.ParamAOTInput, D.BufferAOTInput, D.GradAOTOutput,
                             D.InputMutationAOTOutput))


def state_base(desc: Any) -> Any:
    """``desc``, or for one inner part of DTensor state or gradient, the descriptor of the whole.

    Args:
        desc: A placeholder's or output's ``meta["desc"]``.

    Returns:
        The base descriptor (``ParamAOTInput``, ``GradAOTOutput``, ...) of a
        one-level part of a parameter, buffer or gradient; else ``desc`` itself
        (a part of a plain input stays a part).
    """
    base, attrs = subclass_base(desc)
    return base if len(attrs) == 1 and is_state_or_grad(base) else desc


def has_descriptors(joint: TracedGraph) -> bool:
    """True when the graph's placeholders carry AOT descriptors."""
    return any("desc" in n.meta for n in joint.placeholders)


def _outputs(joint: TracedGraph) -> list[tuple[Any, Any]]:
    out = joint.graph.output_node()
    descs = out.meta.get("desc") or [None] * len(out.args[0])
    return list(zip(out.args[0], descs))


def _aot_plan(joint: TracedGraph) -> Any:
    """The AOT runtime's call plan, for an AOT graph whose descriptors were not kept.

    A graph loaded from disk has no ``meta["desc"]``; the runtime's plan
    (saved with it) records the same roles: which placeholder is the loss
    tangent, which output is the loss, a gradient or a buffer update.
    """
    rt = joint.runtime
    return rt if joint.mode == "aot" and hasattr(rt, "out_plan") else None


def _plan_outputs_and_tangents(joint: TracedGraph, rt: Any) -> list[Pair]:
    outs = [n for n, _ in _outputs(joint)]
    tangent = next((p for p, i in zip(joint.placeholders, rt.arg_plan) if i is None), None)
    loss = [(n, tangent) for n, (kind, _) in zip(outs, rt.out_plan) if kind == "loss"]
    ld = sorted(((i, n) for n, (kind, i) in zip(outs, rt.out_plan) if kind == "ld"),
                key=lambda p: p[0])
    return [p for p in loss + [(n, None) for _, n in ld] if isinstance(p[0], fx.Node)]


def _plan_inputs_and_grads(joint: TracedGraph, rt: Any) -> list[Pair]:
    outs = [n for n, _ in _outputs(joint)]
    grads: dict[int, list[Any]] = {}  # flat index -> gradient outputs, in order
    paths = [leaf.path for leaf in joint.input_spec.tensor_leaves]
    n_state = len(joint.state_spec.fqns)
    own = graph_input_grads(joint.input_spec)
    for n, (kind, pos) in zip(outs, rt.out_plan):
        if kind == "grad":
            grads.setdefault(rt.param_flat[pos], []).append(n)
        elif kind == "igrad":
            grads.setdefault(n_state + paths.index(own[pos]), []).append(n)
    pairs = []
    for ph, i in zip(joint.placeholders, rt.arg_plan):
        if i is None:
            continue
        queue = grads.get(i, [])
        g = queue.pop(0) if queue and info(ph).get("phase") in ("param", "input") else None
        pairs.append((ph, g if _real_grad(g) else None))
    return pairs


def _real_grad(node: Any) -> bool:
    return isinstance(node, fx.Node) and not info(node).get("zero_grad")


def inputs_and_grads(joint: TracedGraph) -> list[Pair]:
    """Every forward input (parameter, buffer, tensor input) with its gradient node.

    Args:
        joint: A traced graph of either mode.

    Returns:
        ``(placeholder, gradient node or None)`` in placeholder order. The
        gradient is None for buffers, frozen and unused parameters, and inputs
        traced without ``requires_grad`` (or that are a parameter, whose gradient
        is the parameter's). In ``aot`` mode a tied weight has one placeholder per
        alias, each with its partial gradient.
    """
    if has_descriptors(joint):
        outs = [(n, state_base(d)) for n, d in _outputs(joint)]
        grads = {d.grad_of: n for n, d in outs
                 if isinstance(d, D.GradAOTOutput) and isinstance(n, fx.Node)}
        return [(n, grads.get(state_base(n.meta["desc"]))) for n in joint.placeholders
                if isinstance(state_base(n.meta.get("desc")),
                              (D.ParamAOTInput, D.BufferAOTInput, D.PlainAOTInput))]
    if (rt := _aot_plan(joint)) is not None:
        return _plan_inputs_and_grads(joint, rt)
    outs = [n for n, _ in _outputs(joint)]
    grads = {name: n for name, n in zip(joint.param_names, outs[1:]) if _real_grad(n)}
    n = 1 + len(joint.param_names)
    own = graph_input_grads(joint.input_spec)
    in_grads = {p: g for p, g in zip(own, outs[n:n + len(own)]) if _real_grad(g)}
    return [(ph, grads.get(info(ph).get("fqn")) if info(ph)["phase"] == "param"
             else in_grads.get(info(ph).get("input_path")))
            for ph in joint.placeholders if info(ph).get("phase") in _INPUT_PHASES]


def outputs_and_tangents(joint: TracedGraph) -> list[Pair]:
    """Every forward output (the loss, then tensor loss_dict values) with its tangent.

    Args:
        joint: A traced graph of either mode.

    Returns:
        ``(output node, tangent placeholder or None)``. In ``aot`` mode the
        loss has a tangent placeholder (the runtime feeds it ones); the
        loss_dict values are detached and have none. In ``make_fx`` mode the
        backward is seeded inside the graph, so every tangent is None.
        Gradient outputs and buffer mutations are not forward outputs.
    """
    if has_descriptors(joint):
        tangents = {n.meta["desc"].output: n for n in joint.placeholders
                    if isinstance(n.meta.get("desc"), D.TangentAOTInput)}
        plain = [(n, d) for n, d in _outputs(joint) if isinstance(d, D.PlainAOTOutput)]
        return [(n, tangents.get(d)) for n, d in sorted(plain, key=lambda p: p[1].idx)
                if isinstance(n, fx.Node)]
    if (rt := _aot_plan(joint)) is not None:
        return _plan_outputs_and_tangents(joint, rt)
    outs = [n for n, _ in _outputs(joint)]
    n_grads = len(joint.param_names) + len(graph_input_grads(joint.input_spec))
    fwd = [outs[0], *outs[1 + n_grads:]]
    return [(n, None) for n in fwd if isinstance(n, fx.Node)]


def _state(joint: TracedGraph, phase: str, desc_type: type) -> dict[str, fx.Node]:
    if has_descriptors(joint):
        return {info(n)["fqn"]: n for n in joint.placeholders
                if isinstance(state_base(n.meta.get("desc")), desc_type)}
    return {info(n)["fqn"]: n for n in joint.placeholders if info(n).get("phase") == phase}


def params(joint: TracedGraph) -> dict[str, fx.Node]:
    """Parameter placeholders by FQN (frozen ones included; in ``aot`` mode, every alias).

    Args:
        joint: A traced graph of either mode.

    Returns:
        FQN to placeholder, in placeholder order.
    """
    return _state(joint, "param", D.ParamAOTInput)


def buffers(joint: TracedGraph) -> dict[str, fx.Node]:
    """Buffer placeholders by FQN.

    Args:
        joint: A traced graph of either mode; buffers are its non-trainable
            state (running statistics, counters), one placeholder each.

    Returns:
        FQN to placeholder, in placeholder order.
    """
    return _state(joint, "buffer", D.BufferAOTInput)
