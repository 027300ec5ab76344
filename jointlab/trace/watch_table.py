"""Every specialisation a trace watches for, as one table: the event, what jointlab does, its error.

A joint graph is valid only under the conditions it was traced in. Each row of
:data:`WATCHES` is one such condition: the event it watches for while
``train_fn`` is traced, its outcome, the error or warning users see, and one
doc line. Outcomes:

- ``refuse``: the trace stops with the row's error (the graph could not be exact);
- ``guard``: the state is recorded and checked before every run (``joint.guards``
  rows of the row's ``kinds``);
- ``swap``: jointlab puts something of its own in place for the trace's length
  (and restores it), so the graph computes what eager computes;
- ``record``: the trace notes what happened for a later pass or view;
- ``warn``: the graph is exact, but something users may not expect is said.

:data:`CORE` holds the generic tracer's rows; a plug-in (``jointlab/plugins/``:
transformers, the MHA fast path, oneDNN RNNs) adds its own with :func:`register`, after a
named row, and :func:`unregistered` traces without one. Rows with ``enter`` are
entered by :func:`watching` around the mode's trace, in table order; the others
are entered where named (``where``), inside a mode or at a pass.
``tests/test_watch_table.py`` checks the table against the code (the tracer
enters exactly these rows, every ``refuse`` row's error is listed in the README,
every guard kind is a :data:`jointlab.facts.KINDS`), so a missing row shows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from jointlab import errors
from jointlab.runtime.constants import without_library_constants
from jointlab.runtime.rank_reads import rank_reads
from jointlab.runtime.torch_errors import torch_errors
from jointlab.trace.fake_world import loss_parallel_refusals, pipeline_schedule_refusals
from jointlab.trace.inplace_collectives import inplace_collective_refusals
from jointlab.trace.lost_backward import no_kernel_warnings
from jointlab.trace.meta_attention import meta_attention_calls
from jointlab.trace.python_state import no_tensor_printing, python_rngs_kept
from jointlab.trace.random_ops import random_op_refusals
from jointlab.trace.read_guards import watching_python_state
from jointlab.trace.refusals import tracing_guard

__all__ = ["CORE", "OUTCOMES", "WATCHES", "Watch", "WatchCall", "plugins", "register",
           "retargets", "unregistered", "watching"]

OUTCOMES = ("refuse", "guard", "swap", "record", "warn")


@dataclass(frozen=True)
class WatchCall:
    """What a row's context needs: the traced call."""

    model: nn.Module
    train_fn: Callable[..., Any]
    mode: str


@dataclass(frozen=True)
class Watch:
    """One specialisation a trace watches for.

    Attributes:
        name: The row's name (also the key of what its context yields in :func:`watching`).
        event: What is watched for, in a user's words.
        outcome: One of :data:`OUTCOMES`.
        error: The error or warning class users see (None: nothing is raised).
        doc: One line: why, and what jointlab does.
        enter: Makes the row's context for one trace; None when entered elsewhere.
        where: For a row without ``enter``, the dotted name of the function that enters
            or applies it.
        kinds: For a ``guard`` row, the ``joint.guards`` kinds it records.
        retargets: For a ``swap`` row the retarget pass applies
            (:func:`jointlab.passes.pipeline.retarget`): ``(op, replacement op)`` pairs.
    """

    name: str
    event: str
    outcome: str
    error: type | None
    doc: str
    enter: Callable[[WatchCall], contextlib.AbstractContextManager[Any]] | None = None
    where: str = ""
    kinds: tuple[str, ...] = ()
    retargets: tuple[tuple[Any, Any], ...] = ()


#: The rows of the generic tracer; plug-ins add theirs with :func:`register`.
CORE: tuple[Watch, ...] = (
    Watch("python rngs", "train_fn draws from random / numpy.random", "refuse",
          errors.UnsupportedRandomOpError,
          "the graph would keep one draw; both generators are put back, whatever happens",
          lambda c: python_rngs_kept()),
    Watch("tensor printing", "user code prints or formats a tensor", "refuse",
          errors.DataDependentError, "a traced tensor has no value to show",
          lambda c: no_tensor_printing()),
    Watch("torch errors", "torch raises while tracing", "refuse", errors.TraceError,
          "torch's error chained, with the user's line and advice",
          lambda c: torch_errors("jl.trace")),
    Watch("optimizer and parameter misuse", "optimizer.step(), backward() or .grad in train_fn",
          "refuse", errors.TrainFnMisuseError,
          "the graph takes gradients itself; train_fn returns the loss",
          lambda c: tracing_guard(c.model)),
    Watch("random ops", "an explicit generator= or random_(from, to)", "refuse",
          errors.UnsupportedRandomOpError, "the graph could not draw what eager draws",
          lambda c: random_op_refusals()),
    Watch("lost backward", "an op with no backward kernel", "record",
          errors.GradientLostError, "refused after the trace if a gradient was lost",
          lambda c: no_kernel_warnings()),
    Watch("meta attention", "SDPA on meta tensors", "record", errors.MetaAttentionWarning,
          "the kernel a real device would take is flagged on the graph",
          lambda c: meta_attention_calls()),
    Watch("rank reads", "dist.get_rank() or a mesh coordinate read", "guard", None,
          "the graph runs only as the ranks that read the same value",
          lambda c: rank_reads(torch_reads=True), kinds=("rank",)),
    Watch("in-place collectives", "an in-place c10d collective in train_fn", "refuse",
          errors.TrainFnMisuseError, "the functional spelling is named",
          lambda c: inplace_collective_refusals()),
    Watch("loss parallel", "loss_parallel() entered inside train_fn", "refuse",
          errors.UnsupportedWrapperError, "entered around jl.trace it is supported",
          lambda c: loss_parallel_refusals(c.mode)),
    Watch("pipeline schedules", "a pipeline schedule's step() inside train_fn", "refuse",
          errors.UnsupportedWrapperError, "one stage's submodule is traceable",
          lambda c: pipeline_schedule_refusals()),
    Watch("python state", "attributes, config fields, items, globals and closure "
          "variables the step reads; attributes it writes", "guard", errors.SideEffectWarning,
          "reads guarded, writes put back and warned", lambda c: watching_python_state(
              c.model, c.train_fn), kinds=("read", "variable", "hooks")),
    Watch("model facts", "training flags, module classes, requires_grad", "guard", None,
          "recorded before any of jointlab's own hooks",
          where="jointlab.assumptions.Assumptions.record",
          kinds=("training", "class", "requires_grad")),
    Watch("global settings", "autocast, SDPA flags, oneDNN, default dtype...", "guard", None,
          "only the settings the graph bakes (jointlab.global_state)",
          where="jointlab.assumptions.Assumptions.relevant_to", kinds=("global",)),
    Watch("dynamic shapes", "the sizes a dynamic trace specialised on", "guard",
          errors.GuardError, "checked on every run before execution",
          where="jointlab.shape_guards.ShapeGuards.validate"),
    Watch("input gradients", "an input traced with requires_grad=True, or an input that is "
          "the model's own parameter", "guard", errors.InputMismatchError,
          "its gradient is a graph output (run(...).input_grads); both checked on every run",
          where="jointlab.inputs.check_leaves"),
    Watch("backward and .grad in train_fn", "loss.backward(), autograd.grad, .grad",
          "refuse", errors.TrainFnMisuseError, "inside train_fn only",
          where="jointlab.trace.refusals.in_train_fn"),
    Watch("parameter writes", "an in-place write to a parameter in train_fn", "refuse",
          errors.TrainFnMisuseError, "the graph would not repeat it",
          where="jointlab.trace.refusals.in_train_fn"),
    Watch("seed calls", "a seed or generator-state call inside train_fn, whoever makes it "
          "(the user, a library helper, torch.default_generator)", "refuse",
          errors.TrainFnMisuseError, "names the function and your line; fork_rng is "
          "recorded in make_fx mode; seed outside and pass seed= to compare/Stepper",
          where="jointlab.trace.rng_calls.seed_call_refusals"),
    Watch("torch.cond", "torch.cond on a tensor predicate inside train_fn", "refuse",
          errors.UnsupportedControlFlowError, "a joint graph cannot hold a data-dependent "
          "branch: select with torch.where, or branch in Python on a value passed in",
          where="jointlab.trace.control_flow.cond_refusals"),
    Watch("parameter hooks", "p.register_hook on a parameter", "swap",
          errors.UnsupportedHookError,
          "registered on the trace's stand-ins, so the graph runs them; post-accumulate "
          "hooks refused", where="jointlab.trace.param_hooks.ParamHooks"),
    Watch("checkpoint", "torch.utils.checkpoint regions", "swap",
          errors.UnsupportedCheckpointError, "recomputes replay eager's RNG exactly",
          where="jointlab.trace.checkpoint.checkpoint_tracing"),
    Watch("baked constants", "a captured number or tensor baked into the graph", "warn",
          errors.BakedConstantWarning, "numbers are guarded too (variable rows)",
          where="jointlab.trace.python_state.warn_baked_constants"),
    Watch("AOT layout-dependent draws", "bernoulli_(p) or rrelu on a non-contiguous tensor "
          "in mode='aot'", "refuse", errors.UnsupportedRandomOpError,
          "AOT's functional forms draw in another order",
          where="jointlab.trace.random_ops.refuse_layout_dependent_draws"),
)


@dataclass(frozen=True)
class _Plugin:
    """One plug-in's rows and the row they follow in the table."""

    rows: tuple[Watch, ...]
    after: str


_PLUGINS: dict[str, _Plugin] = {}
#: Every row, in table order: :data:`CORE` with each registered plug-in's rows in place.
WATCHES: tuple[Watch, ...] = CORE


def _table() -> tuple[Watch, ...]:
    """:data:`CORE` with each plug-in's rows after the row it names, in registration order."""
    rows = list(CORE)
    for name, plugin in _PLUGINS.items():
        names = [w.name for w in rows]
        if plugin.after not in names:
            raise ValueError(f"plug-in {name!r} follows the row {plugin.after!r}, which the "
                             f"table does not have (rows: {', '.join(names)})")
        at = names.index(plugin.after) + 1
        rows[at:at] = plugin.rows
    return tuple(rows)


def register(plugin: str, rows: tuple[Watch, ...], *, after: str) -> None:
    """Add a plug-in's rows to the table (again: replaces that plug-in's rows).

    A plug-in (``jointlab/plugins/``) is everything jointlab knows about one
    library or kernel family: its refusals, guards, swaps and records, each a
    :class:`Watch` row the tracer enters like its own.

    Args:
        plugin: The plug-in's name (``"transformers"``).
        rows: Its rows, in the order they are entered.
        after: The name of the row they follow in the table.

    Raises:
        ValueError: A row name is taken, or ``after`` names no row.
    """
    taken = {w.name for w in CORE} | {w.name for name, p in _PLUGINS.items()
                                      if name != plugin for w in p.rows}
    clash = [w.name for w in rows if w.name in taken]
    if clash:
        raise ValueError(f"plug-in {plugin!r}: row names already in the table: {clash}")
    saved = dict(_PLUGINS)
    _PLUGINS[plugin] = _Plugin(tuple(rows), after)
    try:
        _rebuild()
    except ValueError:
        _rebuild(saved)
        raise


def _rebuild(registered: dict[str, _Plugin] | None = None) -> None:
    """Rebuild :data:`WATCHES` (first setting the registrations to ``registered``, if given)."""
    global WATCHES
    if registered is not None:
        _PLUGINS.clear()
        _PLUGINS.update(registered)
    WATCHES = _table()


def plugins() -> tuple[str, ...]:
    """The registered plug-ins' names, in registration order.

    Returns:
        Their names.
    """
    return tuple(_PLUGINS)


def retargets() -> dict[Any, Any]:
    """The retarget pass's table: every row's ``retargets`` pairs (plug-ins' kernel swaps).

    Returns:
        Op -> replacement op, from the rows of :data:`WATCHES` now registered.
    """
    return {op: new for w in WATCHES for op, new in w.retargets}


@contextlib.contextmanager
def unregistered(plugin: str) -> Iterator[None]:
    """Trace without one plug-in inside the block (its rows are put back after).

    Args:
        plugin: A registered plug-in's name.

    Yields:
        Nothing; the table lacks the plug-in's rows inside the block.

    Raises:
        KeyError: No plug-in of that name is registered.
    """
    if plugin not in _PLUGINS:
        raise KeyError(f"no plug-in {plugin!r} is registered (registered: {plugins()})")
    saved = dict(_PLUGINS)
    del _PLUGINS[plugin]
    _rebuild()
    try:
        with without_library_constants(plugin):  # its constants go unnamed too
            yield
    finally:
        _rebuild(saved)


@contextlib.contextmanager
def watching(call: WatchCall) -> Iterator[dict[str, Any]]:
    """Enter every row of :data:`WATCHES` that has ``enter``, in table order.

    Args:
        call: The traced call.

    Yields:
        What each row's context yielded, by row name (e.g. ``"python state"``).
    """
    with contextlib.ExitStack() as stack:
        yield {w.name: stack.enter_context(w.enter(call)) for w in WATCHES
               if w.enter is not None}


def markdown() -> str:
    """The table as README shows it: one row per watch (``python -m jointlab.trace.watch_table``).

    Returns:
        A Markdown table: event, outcome, what users see, why / what jointlab does.
    """
    lines = ["| what the trace watches for | outcome | you see | why / what jointlab does |",
             "|---|---|---|---|"]
    for w in WATCHES:
        seen = f"`{w.error.__name__}`" if w.error is not None else "—"
        kinds = f" (`joint.guards`: {', '.join(w.kinds)})" if w.kinds else ""
        lines.append(f"| {w.event} | {w.outcome}{kinds} | {seen} | {w.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    # the package's own module, where ``import jointlab`` registered the plug-ins
    from jointlab.trace.watch_table import markdown as registered_markdown

    print(registered_markdown(), end="")
