"""Refuse a joint graph whose gradients do not come from the loss.

Some torch paths drop the backward without an error. The known one: in
``mode="aot"`` on the meta device, ``aten::nll_loss`` (behind
``F.cross_entropy``) has no autograd kernel, torch only *warns* "an autograd
kernel was not registered", and the export has one backward node and a
``None`` for every gradient, which jointlab would turn into zeros. That is a
wrong answer that looks right, so this module checks, after every trace:

- **all lost**: parameters reach the loss through floating-point ops, yet no
  gradient output depends on the loss (its node, or the AOT loss tangent);
- **some lost**: torch warned that an op had no autograd kernel while tracing,
  and a parameter that reaches the loss got no gradient that depends on it.

A parameter the loss genuinely does not use (or uses only through
``detach``, integer or boolean values) keeps its documented zero gradient.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab.errors import GradientLostError

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

_NO_KERNEL = re.compile(r"(\S+): an autograd kernel was not registered")
_STOPS = ("detach",)  # a user detach in make_fx; AOT writes it as alias, which is kept
_PASS_THROUGH = ("getitem", "view", "_unsafe_view", "squeeze", "unsqueeze", "reshape",
                 "clone", "alias", "_to_copy")


@contextlib.contextmanager
def no_kernel_warnings() -> Iterator[list[str]]:
    """Collect the ops torch warns have no autograd kernel; re-emit every warning.

    Yields:
        A list that receives the op names (``aten::nll_loss``) once the block exits.
    """
    ops: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield ops
    for w in seen:
        hit = _NO_KERNEL.search(str(w.message))
        if hit and hit.group(1) not in ops:
            ops.append(hit.group(1))
    shown: set[tuple[str, type, str, int]] = set()
    for w in seen:  # once each, as the default filter would have shown them
        key = (str(w.message), w.category, w.filename, w.lineno)
        if key not in shown:
            shown.add(key)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _loss_node(joint: TracedGraph) -> fx.Node | None:
    outs = list(joint.graph.output_node().args[0])
    plan = getattr(joint.runtime, "out_plan", None)
    index = plan.index(("loss", 0)) if plan and ("loss", 0) in plan else 0
    node = outs[index] if outs else None
    return node if isinstance(node, fx.Node) else None


def _is_differentiable_value(node: fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    floating = any(isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
                   for v in vals)
    return floating and _meta.op_name(node) not in _STOPS


def _feeding_placeholders(loss: fx.Node) -> set[fx.Node]:
    """Placeholders with a path of floating, non-detach values into ``loss``."""
    seen, todo, found = {loss}, [loss], set()
    while todo:
        node = todo.pop()
        for src in node.all_input_nodes:
            if src in seen or not _is_differentiable_value(src):
                continue
            seen.add(src)
            (found.add if src.op == "placeholder" else todo.append)(src)
    return found


def _from_seeds(seeds: list[fx.Node]) -> set[fx.Node]:
    reached, todo = set(seeds), list(seeds)
    while todo:
        for user in todo.pop().users:
            if user not in reached:
                reached.add(user)
                todo.append(user)
    return reached


def _loss_op(loss: fx.Node) -> fx.Node:
    node = loss
    while _meta.op_name(node) in _PASS_THROUGH and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def lost_gradients(joint: TracedGraph) -> tuple[list[str], list[str]]:
    """Parameters whose gradient does not depend on the loss although they feed it.

    Args:
        joint: A freshly traced joint graph.

    Returns:
        ``(lost, kept)``: FQNs of parameters that reach the loss through
        floating-point ops, split by whether their gradient output is
        reachable from the loss (or its tangent).
    """
    loss = _loss_node(joint)
    if loss is None:
        return [], []
    seeds = [loss] + [n for n in joint.placeholders if _meta.phase(n) == "backward"]
    from_loss = _from_seeds(seeds)
    feeding = _feeding_placeholders(loss)
    lost, kept = [], []
    placeholders = joint.params()
    for name, terms in joint.grad_terms().items():
        if placeholders[name] in feeding:
            (kept if any(g in from_loss for g in terms) else lost).append(name)
    return lost, kept


def refuse_lost_backward(joint: TracedGraph, no_kernel_ops: list[str]) -> None:
    """Raise :class:`GradientLostError` when the trace lost (part of) the backward.

    Args:
        joint: The traced joint graph.
        no_kernel_ops: Ops torch warned have no autograd kernel during the trace.

    Raises:
        GradientLostError: No gradient depends on the loss, or one is missing
            and torch reported an op without an autograd kernel.
    """
    lost, kept = lost_gradients(joint)
    if not lost or (kept and not no_kernel_ops):
        return
    loss = _loss_node(joint)
    op = _loss_op(loss) if loss is not None else None
    where = _meta.info(op).get("source", "") if op is not None else ""
    loss_op = f"aten::{_meta.op_name(op)}" if op is not None else "?"
    cause = (f"torch warned that {', '.join(no_kernel_ops)} has no autograd kernel here"
             if no_kernel_ops else "an op on the loss path has no derivative in this trace")
    shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
    reduce = _all_reduce_on_loss_path(loss) if loss is not None and not no_kernel_ops else None
    raise GradientLostError(
        f"the traced backward lost the gradients of {len(lost)} of {len(lost) + len(kept)} "
        f"parameters that the loss depends on ({shown}): in the {joint.mode} graph they do "
        f"not depend on the loss, so jointlab would report zeros. {cause} (the loss is "
        f"computed by {loss_op}{' at ' + where if where else ''}). "
        + (_PARTIAL_HINT.format(op=_meta.op_name(reduce),
                                where=_meta.info(reduce).get("source", "") or "?")
           if reduce is not None else _META_HINT))


_META_HINT = (
    "This happens with mode='aot' on the meta device and F.cross_entropy/nll_loss: use "
    "mode='make_fx', an mse_loss or a hand-written loss ((logits.logsumexp(-1) - "
    "logits.gather(-1, labels[..., None]).squeeze(-1)).mean()), or trace on CPU fakes "
    "instead of meta (jointlab.runtime.fakes). For your own op, register its autograd "
    "formula.")
_PARTIAL_HINT = (
    "The loss is computed from a Partial DTensor (a sum still pending over the ranks) that "
    "DTensor all-reduces on the way (a functional {op} at {where}), and this trace does "
    "not carry the gradient back through that Partial -> Replicate step (an explicit "
    ".redistribute(placements=[Replicate()]) loses it too). Compute the loss from "
    "out.full_tensor(), which traces with its gradient, and check the gradients with "
    "jl.run_all_ranks.")


def _all_reduce_on_loss_path(loss: fx.Node) -> fx.Node | None:
    """The last forward ``all_reduce`` the loss is computed from, or None."""
    seen, todo = {loss}, [loss]
    while todo:
        node = todo.pop(0)
        if _meta.op_name(node).startswith("all_reduce") and _meta.phase(node) == "forward":
            return node
        for src in node.all_input_nodes:
            if src not in seen:
                seen.add(src)
                todo.append(src)
    return None
