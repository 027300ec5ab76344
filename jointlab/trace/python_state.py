"""Python state that a trace silently freezes, and tensor printing while tracing.

A joint graph replays ops, not Python. A float read from ``train_fn``'s
closure or its module globals, or a tensor captured from outside the model,
becomes a literal of the graph: changing it later has no effect on
:meth:`JointGraph.run`. :func:`warn_baked_constants` finds such values after a
trace and warns once per trace with their names and values.

Not every tensor constant of a graph is captured state. ``torch.tensor(data)``
and ``x[i] = 3`` inside the traced code create *fresh literals*: a constant
read only by ``lift_fresh_copy``. A one-element fresh literal is a Python
number of the code, like any literal argument (T5 writes its
``decoder_start_token_id`` so); it is checked against captured numbers like
the other literals, not reported itself. An empty one holds no data and cannot
change any value; one a library's code makes (registered by its plug-in as a
:class:`~jointlab.runtime.constants.LibraryConstant`: HF's KV cache with
``use_cache=True``) is reported with the plug-in's fix. Any other tensor
constant, e.g. a captured tensor or a parameter baked into the graph, is reported as before.
:func:`no_tensor_printing` turns ``print(tensor)`` in user code during a trace
(which would only show a fake tensor) into a :class:`DataDependentError`.
:func:`python_rngs_kept` refuses a step that draws from Python's or numpy's
global generator while traced (the graph would keep that one draw; HF's
SpecAugment masks draw from ``np.random``), and puts both generators back
after the trace, whatever happens: tracing must not change the user's random
stream.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import random
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab.errors import (
    BakedConstantWarning,
    DataDependentError,
    UnsupportedRandomOpError,
    user_stacklevel,
)
from jointlab.patching import patched
from jointlab.runtime.constants import (
    LibraryConstant,
    graph_constant,
    is_fresh_literal,
    is_scalar_literal,
    library_constant,
)
from jointlab.sources import is_user_frame, source_location
from jointlab.torch_compat import is_op_overload, op_schema

_SCALARS = (int, float)


def closure_values(fn: Callable[..., Any]) -> dict[str, Any]:
    """Free variables and referenced module globals of ``fn``, by name.

    Args:
        fn: A Python function (others, e.g. builtins, give an empty dict).

    Returns:
        ``{name: value}`` for closure cells and globals the code names.
    """
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    out: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):  # an empty cell
            out[name] = cell.cell_contents
    glb = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in glb and name not in out:
            out[name] = glb[name]
    return out


def _graph_literals(gm: fx.GraphModule) -> list[Any]:
    found: list[Any] = []

    def visit(a: Any) -> None:
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
        elif isinstance(a, _SCALARS) and not isinstance(a, bool):
            found.append(a)

    for node in gm.graph.nodes:
        if node.op == "call_function":
            for arg in _value_args(node):
                visit(arg)
        elif is_scalar_literal(gm, node):
            found.append(graph_constant(gm, node).reshape(()))
    return found


def _value_args(node: fx.Node) -> list[Any]:
    """``node``'s arguments that are values, not shapes.

    A size, dim or count argument (schema type ``int``/``SymInt``/``int[]``...,
    e.g. ``view``'s sizes) cannot be passed as a tensor or a buffer, so a number
    there is no state to warn about.
    """
    if not is_op_overload(node.target):
        return [*node.args, *node.kwargs.values()]
    schema = op_schema(node.target).arguments
    kinds = {a.name: str(a.type) for a in schema}
    pairs = [*zip((a.name for a in schema), node.args), *node.kwargs.items()]
    return [v for name, v in pairs if not _STRUCTURAL.match(kinds.get(name, ""))]


_STRUCTURAL = re.compile(r"^(Optional\[)?(List\[)?(int|SymInt)\]?\]?$")


def _matches(value: float, literal: Any) -> bool:
    if isinstance(literal, torch.Tensor):  # a fresh scalar literal, in its own dtype
        return bool(torch.tensor(value, dtype=literal.dtype) == literal)
    return literal == value or (isinstance(literal, float)
                                and math.isclose(literal, value, rel_tol=1e-12))


def _appears(value: float, literals: list[Any]) -> bool:
    return any(_matches(value, v) for v in literals)


def baked_scalars(gm: fx.GraphModule, fns: dict[str, Callable[..., Any]]) -> list[str]:
    """Captured Python numbers whose value appears as a literal in the graph.

    Args:
        gm: The traced graph.
        fns: Functions whose closures and globals to inspect, by a display name.

    Returns:
        One description per captured number, e.g. ``"train_fn: scale = 0.5 (float)"``.
    """
    literals = _graph_literals(gm)
    out = []
    for where, fn in fns.items():
        for name, value in closure_values(fn).items():
            if (isinstance(value, _SCALARS) and not isinstance(value, bool) and value not in (0, 1)
                    and _appears(value, literals)):
                out.append(f"{where}: {name} = {value!r} ({type(value).__name__})")
    return out


def _holds_no_user_state(gm: fx.GraphModule, node: fx.Node) -> bool:
    t = graph_constant(gm, node)
    return is_scalar_literal(gm, node) or (is_fresh_literal(gm, node) and t.numel() == 0)


def _describe(gm: fx.GraphModule, node: fx.Node) -> str:
    t = graph_constant(gm, node)
    return (f"{node.target}: tensor{list(t.shape)} {t.dtype} (used by "
            f"{', '.join(u.name for u in node.users)})")


def baked_tensors(gm: fx.GraphModule) -> list[str]:
    """Tensors the trace lifted into the graph as constants that hold captured data.

    Fresh one-element and empty literals (see the module docstring) are left out.
    """
    return [_describe(gm, node) for node in gm.graph.find_nodes(op="get_attr")
            if graph_constant(gm, node) is not None and not _holds_no_user_state(gm, node)]


def library_constants(gm: fx.GraphModule) -> dict[LibraryConstant, list[str]]:
    """Empty constants a registered library's code put into the graph, by library.

    (HF's KV cache with ``use_cache=True``: :mod:`jointlab.plugins.transformers`.)
    """
    out: dict[LibraryConstant, list[str]] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        kind = library_constant(gm, node)
        if kind is not None:
            out.setdefault(kind, []).append(_describe(gm, node))
    return out


def _forwards(model: nn.Module) -> dict[str, Callable[..., Any]]:
    return {f"{name or type(model).__name__}.forward": type(m).forward
            for name, m in model.named_modules()}


def warn_baked_constants(gm: fx.GraphModule, train_fn: Callable[..., Any],
                         model: nn.Module) -> list[str]:
    """Warn about captured Python state that the trace froze into ``gm``.

    Args:
        gm: The traced joint graph.
        train_fn: The user's training function.
        model: The traced model (its modules' ``forward`` functions are inspected).

    Returns:
        The descriptions warned about (empty: no warning).
    """
    scalars = baked_scalars(gm, {"train_fn": train_fn, **_forwards(model)})
    tensors = baked_tensors(gm)
    found = scalars + tensors
    if found:
        said = []
        if scalars:
            said.append("Python numbers baked into the joint graph as constants: "
                        + "; ".join(scalars) + " (guarded: run() refuses once one changes, "
                        "see joint.guards)")
        if tensors:
            said.append("tensors captured from Python baked into it: " + "; ".join(tensors)
                        + " (guarded by value where the step read them from a module "
                        "attribute, a global or train_fn's closure: see joint.guards; a tensor "
                        "reached any other way is not checked)")
        warnings.warn(
            "values captured from Python: " + "; ".join(said) + ". To let them vary, pass "
            "them to train_fn as inputs (tensors) or register them on the model as buffers, "
            "then trace again.", BakedConstantWarning, stacklevel=user_stacklevel())
    for kind, names in library_constants(gm).items():
        warnings.warn(
            f"{kind.what} during the traced step ({len(names)} empty tensors baked into "
            "the graph: " + "; ".join(names[:2]) + ("; ..." if len(names) > 2 else "")
            + f"). A training step does not need it: {kind.fix}, then trace again.",
            BakedConstantWarning, stacklevel=user_stacklevel())
        found += names
    return found


@contextlib.contextmanager
def no_tensor_printing() -> Iterator[None]:
    """Raise :class:`DataDependentError` when user code prints a tensor while tracing."""
    kinds = ("__repr__", "__str__", "__format__")
    saved = {k: getattr(torch.Tensor, k) for k in kinds}

    def guard(kind: str) -> Callable[..., Any]:
        orig = saved[kind]

        def method(self: torch.Tensor, *args: Any) -> Any:
            caller = sys._getframe(1)
            if is_user_frame(caller.f_code.co_filename):
                line = inspect.getframeinfo(caller).code_context or [""]
                where = source_location(caller.f_code.co_filename, caller.f_lineno)
                raise DataDependentError(
                    "the training step prints or formats a tensor while tracing at "
                    f"{where}: {line[0].strip()}. "
                    "A traced tensor has no value yet, so this would show a placeholder. "
                    "Remove the print, or inspect values with jointlab.Stepper after tracing.")
            return orig(self, *args)
        return method

    with patched([(torch.Tensor, kind, guard(kind)) for kind in kinds]):
        yield


def _rng_states() -> tuple[Any, Any]:
    np = sys.modules.get("numpy")  # not imported yet: the trace cannot have drawn from it
    return random.getstate(), (np.random.get_state() if np is not None else None)


def _drawn(before: tuple[Any, Any], after: tuple[Any, Any]) -> list[str]:
    out = ["Python's random module"] if before[0] != after[0] else []
    b, a = before[1], after[1]
    if b is not None and a is not None and (b[2:] != a[2:] or (b[1] != a[1]).any()):
        out.append("numpy.random")
    return out


def _restore(state: tuple[Any, Any]) -> None:
    random.setstate(state[0])
    np = sys.modules.get("numpy")
    if np is not None and state[1] is not None:
        np.random.set_state(state[1])


@contextlib.contextmanager
def python_rngs_kept() -> Iterator[None]:
    """Refuse a draw from ``random`` or ``numpy.random`` in the block; restore both generators.

    The graph would keep the one draw the trace made (a layerdrop's
    ``random.random() < p``, a numpy mask) for ever, while eager draws anew every
    step. Both generators end where they started, also on error or refusal.

    Yields:
        Nothing.

    Raises:
        UnsupportedRandomOpError: The block drew from either generator.
    """
    before = _rng_states()
    try:
        yield
        drawn = _drawn(before, _rng_states())
        if drawn:
            raise UnsupportedRandomOpError(
                f"the traced step drew from {' and '.join(drawn)} while traced (a layerdrop "
                "`random.random() < p`, a numpy mask...). The graph would keep that one draw "
                "for ever, while eager draws anew every step. Draw with torch (torch.rand, "
                "torch.bernoulli: the graph draws those each run), or draw outside train_fn "
                "and pass the result in as an input.")
    finally:
        _restore(before)
