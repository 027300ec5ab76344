"""Dynamic-shape inputs for tracing, and the guards that check them at run time.

A dynamic trace marks chosen dims of the user's tensors as symbolic. The shape
environment then records every assumption the trace made about them: sizes
0 and 1 are specialized, equal dims are unified, and a Python branch on a
size becomes a guard. :class:`ShapeGuards` keeps those facts as plain sympy
expressions (no fake mode, no storage) and checks a new call against them,
naming the input, the dim, what was expected and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from jointlab.errors import GuardError, InputStructureError
from jointlab.sources import source_location

if TYPE_CHECKING:  # sympy and the shape environment load on first use: import jointlab stays light
    import sympy

    from jointlab.torch_compat import ShapeEnv


def resolve_dynamic_dims(
    tensor_leaves: list[tuple[str, torch.Tensor]],
    dynamic: bool,
    dynamic_arg_dims: dict[str, int | list[int]] | None,
) -> dict[str, set[int]]:
    """Turn the user's ``dynamic`` / ``dynamic_arg_dims`` into dims per input path.

    Args:
        tensor_leaves: ``(dotted path, tensor)`` for every tensor input.
        dynamic: Mark every dim of every tensor input dynamic.
        dynamic_arg_dims: Dotted path to a dim or list of dims (negative allowed).

    Returns:
        Non-negative dynamic dims per path; empty for a static trace.

    Raises:
        InputStructureError: A path is unknown or a dim is out of range.
    """
    if dynamic_arg_dims is None:
        return {p: set(range(t.dim())) for p, t in tensor_leaves if t.dim()} if dynamic else {}
    by_path = dict(tensor_leaves)
    out: dict[str, set[int]] = {}
    for path, dims in dynamic_arg_dims.items():
        if path not in by_path:
            raise InputStructureError(
                f"dynamic_arg_dims names '{path}', which is not a tensor input. "
                f"Tensor inputs are: {', '.join(by_path) or '(none)'}."
            )
        rank = by_path[path].dim()
        for d in [dims] if isinstance(dims, int) else list(dims):
            if not -rank <= d < rank:
                raise InputStructureError(
                    f"dynamic_arg_dims['{path}'] has dim {d}, but '{path}' has rank {rank}."
                )
            out.setdefault(path, set()).add(d % rank)
    return out


def _where(sloc: Any) -> str:
    """``file:line in fn: code`` of the frame that created a guard."""
    frame = getattr(sloc, "maybe_user_loc", None) or getattr(sloc, "framework_loc", None)
    if frame is None or isinstance(frame, str):
        return str(frame or sloc or "")
    code = f": {frame.line.strip()}" if getattr(frame, "line", None) else ""
    return f"{source_location(frame.filename, frame.lineno)} in {frame.name}{code}"


@dataclass
class ShapeGuards:
    """What a dynamic trace assumed about its inputs' sizes, as plain sympy."""

    dims: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    traced_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dynamic_dims: dict[str, set[int]] = field(default_factory=dict)
    ranges: dict[sympy.Symbol, tuple[Any, Any]] = field(default_factory=dict)
    guards: list[tuple[Any, str]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One ``joint.guards`` row per dynamic dim and per recorded size guard."""
        out = [dict(kind="shape", target=path, attr=f"dim {d}", traced=self.traced_sizes[path][d],
                    checks=f"size is {self.dims[path][d]}", source="jl.trace(dynamic=...)")
               for path, dims in self.dynamic_dims.items() for d in sorted(dims)]
        out.extend(dict(kind="shape", target="inputs", attr="guard", traced=True,
                        checks=str(expr), source=str(sloc)) for expr, sloc in self.guards)
        return out

    @classmethod
    def record(
        cls,
        shape_env: ShapeEnv,
        fakes: list[tuple[str, torch.Tensor]],
        real_sizes: dict[str, tuple[int, ...]],
        dynamic_dims: dict[str, set[int]],
    ) -> ShapeGuards:
        """Read the shape environment after tracing.

        Args:
            shape_env: The environment the trace ran under.
            fakes: ``(path, fake tensor)`` for every tensor input.
            real_sizes: Trace-time sizes, for messages.
            dynamic_dims: The dims the user asked to be dynamic.

        Returns:
            The recorded guards, independent of the fake mode.
        """
        import sympy

        out = cls(traced_sizes=dict(real_sizes), dynamic_dims=dict(dynamic_dims))
        for path, fake in fakes:
            exprs = []
            for s in fake.shape:
                expr = s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s)
                exprs.append(shape_env.replace(expr))
            out.dims[path] = tuple(exprs)
        for sym, vr in shape_env.var_to_range.items():
            out.ranges[sym] = (vr.lower, vr.upper)
        for g in shape_env.guards:
            expr = shape_env.replace(g.expr)
            if expr in (sympy.true, True):
                continue
            out.guards.append((expr, _where(getattr(g, "sloc", None))))
        return out

    def validate(self, tensors: dict[str, torch.Tensor]) -> dict[sympy.Symbol, int]:
        """Check the given tensor inputs against every recorded assumption.

        Args:
            tensors: The tensor inputs of a call, by dotted path.

        Returns:
            The value each size symbol takes in this call.

        Raises:
            GuardError: A size breaks a guard; the message names the dim.
        """
        import sympy

        bindings: dict[sympy.Symbol, int] = {}
        where: dict[sympy.Symbol, str] = {}
        for path, exprs in self.dims.items():
            shape = tuple(tensors[path].shape)
            for d, (expr, got) in enumerate(zip(exprs, shape)):
                self._bind(path, d, expr, int(got), bindings, where)
        subs = {k: sympy.Integer(v) for k, v in bindings.items()}
        for expr, sloc in self.guards:
            if expr.free_symbols <= bindings.keys() and not bool(expr.xreplace(subs)):
                given = ", ".join(f"{where[s]} = {bindings[s]}"
                                  for s in sorted(expr.free_symbols, key=str))
                at = f" (at {sloc})" if sloc else ""
                raise GuardError(
                    f"the trace took a shape-dependent branch that requires "
                    f"{self._readable(expr, where)}{at}, but got {given}. Trace again "
                    "with inputs of this size, or avoid branching on sizes."
                )
        for sym, (lo, hi) in self.ranges.items():
            if sym in bindings and not lo <= bindings[sym] <= hi:
                why = (
                    " PyTorch specializes sizes 0 and 1, so a dynamic dim traced with a "
                    "size >= 2 cannot take them; trace with that size instead."
                    if bindings[sym] < 2 <= lo else " Trace again with inputs of this size."
                )
                raise GuardError(
                    f"{where[sym]} is {bindings[sym]}, but the trace assumed it lies in "
                    f"[{lo}, {hi}].{why}"
                )
        return bindings

    @staticmethod
    def _readable(expr: Any, where: dict[sympy.Symbol, str]) -> str:
        import sympy

        names = {s: sympy.Symbol(f"<{where.get(s, s)}>") for s in expr.free_symbols}
        return str(expr.xreplace(names))

    def _bind(self, path, d, expr, got, bindings, where) -> None:
        import sympy

        desc = f"dim {d} of '{path}'"
        traced = self.traced_sizes[path][d]
        if isinstance(expr, sympy.Symbol):
            if expr not in bindings:
                bindings[expr], where[expr] = got, desc
                return
            want = bindings[expr]
            if want != got:
                raise GuardError(
                    f"{desc} is {got}, but the trace requires it to equal {where[expr]} "
                    f"(= {want}). The two dims were unified at trace time."
                )
            return
        if expr.free_symbols <= bindings.keys():
            want = int(expr.xreplace({k: sympy.Integer(v) for k, v in bindings.items()}))
            if want != got:
                why = ""
                if not expr.free_symbols and d in self.dynamic_dims.get(path, ()):
                    why = f" It was marked dynamic but specialized to {traced} at trace time" + (
                        ": PyTorch specializes sizes 0 and 1. Trace with a size >= 2."
                        if traced < 2 else
                        ": the traced code needs this exact size (an op or a branch fixed "
                        "it). Trace again with inputs of this size, or make that code "
                        "independent of the size."
                    )
                elif not expr.free_symbols:
                    why = " This dim is static in the trace."
                raise GuardError(f"{desc} is {got}, but the trace expected {want}.{why}")

