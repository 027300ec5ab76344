"""Random ops and a compiled candidate: what float64 cannot referee, and what to blame.

A float64 eager run (:mod:`jointlab.analysis.compare.fp64`) draws its own
random numbers: a dropout mask drawn for a float64 tensor, or by a compiled
kernel in another order (a fused conv's channels-last output), is not the mask
float32 eager drew. A loss or gradient downstream of a random op therefore
cannot be excused as "eager's own rounding" by its distance to float64, and a
compiled candidate's divergence there may be nothing but another draw. The
kernel-by-kernel check does not run on graphs with random ops
(:mod:`jointlab.analysis.kernel_probe`), so the random op's own output is not
compared: :func:`blame_random_op` names the first random op upstream of the
reported value instead, and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch.fx as fx

from jointlab import meta as _meta
from jointlab.analysis.compare.capture import EagerCapture
from jointlab.analysis.compare.fp64 import accept_by_fp64
from jointlab.analysis.compare.judge import Tolerance
from jointlab.analysis.compare.result import Comparison, Divergence

__all__ = ["blame_random_op", "downstream_of", "random_nodes", "random_note", "referee_fp64"]


def random_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The nodes of ``graph`` that draw random numbers, in graph order."""
    return [n for n in graph.nodes if _meta.draws_random(n)]


def downstream_of(sources: Iterable[fx.Node]) -> set[fx.Node]:
    """Every node that reads, directly or not, one of ``sources`` (the sources included)."""
    seen: set[fx.Node] = set()
    todo = list(sources)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.users)
    return seen


def _label(node: fx.Node) -> str:
    info = _meta.info(node) if _meta.KEY in node.meta else {}
    op = _meta.op_name(node)
    where = f"in '{_meta.module_label(info.get('module') or '')}'"
    return f"{node.name} {where}" if node.name == op else f"{node.name} ({op} {where})"


def random_note(rand: list[fx.Node], skipped: list[str]) -> str:
    """Why float64 eager does not referee the values ``skipped`` (downstream of ``rand``).

    Args:
        rand: The graph's random ops.
        skipped: The loss and gradient names float64 was not used for.

    Returns:
        One note naming the random ops.
    """
    ops = ", ".join(_label(n) for n in rand[:4]) + (f" and {len(rand) - 4} more"
                                                     if len(rand) > 4 else "")
    return (f"the graph draws random numbers ({ops}): float64 eager draws its own masks "
            "(and compiled code may draw in another order), so a float64 reference means "
            "nothing downstream of them and was not used to accept "
            + (", ".join(skipped) if skipped else "any value"))


def referee_fp64(comp: Comparison, eager: EagerCapture, tol: Tolerance, joint: Any
                 ) -> Comparison:
    """:func:`accept_by_fp64`, except for values downstream of a random op (named in a note).

    Args:
        comp: The comparison with its ``fp64`` table.
        eager: The float32 eager capture.
        tol: The compiled candidates' tolerance.
        joint: The traced graph.

    Returns:
        ``comp`` with the values float64 may referee accepted, and the note.
    """
    rand = random_nodes(joint.graph)
    if not rand:
        return accept_by_fp64(comp, eager, tol)
    reach = downstream_of(rand)
    values = {("loss", "loss"): [joint.outputs_and_tangents()[0][0]]}
    values.update({("grads", k): terms for k, terms in joint.grad_terms().items()})
    names = {n for t in ("loss", "grads") for n in getattr(comp, t)["name"]}
    skip = {(t, n) for t in ("loss", "grads") for n in names
            if any(v in reach or not isinstance(v, fx.Node) for v in values.get((t, n), [None]))}
    bad = {(t, n) for t in ("loss", "grads") for n in
           getattr(comp, t).loc[~getattr(comp, t)["ok"].astype(bool), "name"]}
    comp = accept_by_fp64(comp, eager, tol, skip=skip)
    return dataclasses.replace(comp, notes=(*comp.notes, random_note(
        rand, sorted(n for _, n in skip & bad))))


def blame_random_op(comp: Comparison, joint: object, rand: list[fx.Node]) -> Comparison:
    """``first_divergence`` of a compiled candidate moved to the random op upstream of it.

    A compiled divergence read off a loss or gradient (no kernel named) that lies
    downstream of a random op may be another draw of that op, which no check here
    can rule out: the first random op (graph order) upstream of the value is named,
    and a note keeps the value that was found.

    Args:
        comp: The comparison (``first_divergence`` as named for the candidate).
        joint: The traced graph (``.graph``).
        rand: Its random ops.

    Returns:
        ``comp``, changed only when that applies.
    """
    first = comp.first_divergence
    if first is None or first.candidate == "graph" or first.kernel or not rand:
        return comp
    node = next((n for n in joint.graph.nodes if n.name == first.node), None)
    if node is None:
        return comp
    upstream = [r for r in rand if node in downstream_of([r])]
    if not upstream:
        return comp
    op = upstream[0]
    info = _meta.info(op) if _meta.KEY in op.meta else {}
    blamed = Divergence(op.name, info.get("module", ""), info.get("source", ""),
                        info.get("phase", ""), "random op (its draw is not checked) upstream "
                        f"of {first.what} {first.node}", first.max_abs_err, first.max_rel_err,
                        candidate=first.candidate)
    note = (f"{first} lies downstream of random op {_label(op)}; a compiled "
            "kernel that draws another mask (another order, another generator) differs "
            "exactly like this, and the kernel-by-kernel check does not run with random ops, "
            "so first_divergence names the random op: compare in eval mode (no draws) to tell "
            "a wrong draw from a wrong op")
    return dataclasses.replace(comp, first_divergence=blamed, notes=(*comp.notes, note))
