"""What stepping compiled code kernel by kernel refuses: CompiledStepper's checks.

:func:`is_compiled_joint` tells a compiled joint graph from a traced one. A
compiled graph is stepped kernel by kernel only when jointlab compiled it with
Inductor directly (:func:`refuse_unsteppable`), on the device it was traced
for (:func:`check_device`), with a generated ``call`` that takes the args the
stepper gives (:func:`check_arity`); :func:`kernel_breakpoint` refuses a
breakpoint with a value condition, or one no kernel call would stop at. Each
refusal is a :class:`jointlab.errors.CompiledGraphError` or
:class:`jointlab.errors.StepperError` that says what to do instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from jointlab.analysis.step.breakpoints import Breakpoint, check_breakpoint
from jointlab.analysis.step.kernel_code import call_arity
from jointlab.errors import CompiledGraphError, StepperError

__all__ = ["check_arity", "check_device", "is_compiled_joint", "kernel_breakpoint",
           "refuse_unsteppable"]


def is_compiled_joint(obj: Any) -> bool:
    """True for a :class:`jointlab.CompiledJoint` (it has a ``source`` graph and a backend)."""
    return hasattr(obj, "source") and hasattr(obj, "backend") and hasattr(obj, "compiled")


def refuse_unsteppable(compiled: Any) -> None:
    """Refuse a compiled graph whose kernels are not known (not jointlab's own Inductor compile).

    Args:
        compiled: A :class:`jointlab.CompiledJoint`.

    Raises:
        CompiledGraphError: Another backend, or Inductor through torch.compile.
    """
    inner = compiled.compiled
    if compiled.backend != "inductor" or not hasattr(inner, "provenance"):
        raise CompiledGraphError(
            f"jl.Stepper can step a compiled graph only when jointlab compiled it with "
            f"Inductor directly (joint.compile('inductor') on a static-shape graph); this one "
            f"was compiled with backend={compiled.backend!r}"
            + ("" if compiled.backend != "inductor" else " through torch.compile (dynamic "
               "shapes)") + ", so its kernels are not known. Step compiled.source to step "
            "the uncompiled graph node by node.")


def check_device(source: Any, device: str | torch.device | None) -> None:
    """Refuse a device other than the one the graph was traced and compiled for.

    Args:
        source: The compiled graph's source (the traced joint graph).
        device: The device asked for, or None (no check).

    Raises:
        CompiledGraphError: ``device`` is not where the graph's kernels run.
    """
    traced_on = {torch.device(d) for d in source.state_spec.devices}
    if device is not None and traced_on and traced_on != {torch.device(device)}:
        raise CompiledGraphError(
            f"this graph was compiled for {', '.join(sorted(map(str, traced_on)))}, not "
            f"{device}: its kernels run only there. Trace and compile on {device} to step "
            "there.")


def check_arity(inner: Any, n_graph_args: int) -> None:
    """Refuse when the generated ``call`` unpacks another number of args than it would get.

    Args:
        inner: The compiled module (its ``source_code`` and ``lifted`` constants).
        n_graph_args: How many args the graph gives ``call`` after the lifted constants.

    Raises:
        CompiledGraphError: ``call`` takes another number of args.
    """
    want, lifted = call_arity(inner.source_code), len(inner.lifted)
    if want is not None and want != lifted + n_graph_args:
        raise CompiledGraphError(
            f"the generated code's call() takes {want} args, but the graph gives "
            f"{n_graph_args} and Inductor lifted {lifted} baked constants: this compile "
            "passes its code arguments jointlab does not know, so it cannot be stepped "
            "(compiled.run still runs it).")


def kernel_breakpoint(joint: Any, joint_nodes: dict[str, fx.Node],
                      covers: dict[str, tuple[str, ...]], node: str | None, module: str | None,
                      op: str | None, when: Any) -> Breakpoint:
    """A breakpoint on compiled code, refused where no kernel call would stop at it.

    Args:
        joint: The compiled graph's source (the traced joint graph).
        joint_nodes: Its nodes by name.
        covers: Per kernel call, the joint-graph nodes it covers.
        node: A joint-graph node name.
        module: A module FQN prefix (backward nodes too).
        op: An op (``"aten.mm"``, ``"mm"`` or ``"aten.mm.default"``).
        when: Refused: kernels write buffers, not node values.

    Returns:
        The breakpoint.

    Raises:
        StepperError: The parts name nothing in the graph (with the nearest names), a
            value condition was given, or no kernel covers the nodes they select.
    """
    if when is not None:
        raise StepperError(
            "when= is not supported when stepping compiled code: a kernel writes buffers, "
            "not joint-graph node values. Step, then read stepper.boundary(), or put the "
            "condition on a Stepper over compiled.source.")
    if node is not None and node not in joint_nodes:
        raise StepperError(f"the graph has no node named {node!r}")
    bp = Breakpoint(node, module, op)
    check_breakpoint(bp, list(joint.graph.nodes))
    selected = [n.name for n in joint.graph.nodes if bp.selects(n)]
    covered = {n for names in covers.values() for n in names}
    if not set(selected) & covered:
        raise StepperError(
            f"{bp!r} selects {', '.join(selected[:6])}, but no kernel of the compiled code "
            "covers any of them (Inductor folded them into other kernels' indexing or "
            "left no provenance), so it would never stop. Pick a compute node or module.")
    return bp
