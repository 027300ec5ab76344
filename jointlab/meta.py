"""The one ``node.meta`` namespace jointlab writes, and small readers for it.

Every jointlab pass writes its per-node facts into ``node.meta["jointlab"]``,
a plain dict of JSON-friendly values. Tables, plots, widgets and the report
only read it. Keys written at trace time:

- ``phase``: ``param``, ``buffer``, ``input``, ``forward``, ``backward`` or ``output``.
- ``module``: FQN of the owning module (``""`` is the root module;
  :data:`TRAIN_FN` marks ops of the loss outside any module).
- ``module_type``: class name of that module, or ``""``.
- ``source``: the user's ``file:line`` that created the node, or ``""``.
- ``fqn``: for parameter and buffer placeholders, their state name.
- ``input_path``: for user-input placeholders, the dotted input path.
- ``grad_of``: for gradient outputs, the parameter FQN.
- ``input_grad_of``: for an input-gradient output, the dotted input path of the
  input (traced with ``requires_grad=True``) whose gradient it is.
- ``zero_grad``: the node only emits zeros for a parameter (or input) without a gradient.
- ``probe_out`` / ``probe_grad``: ``[fqn, call, leaf]`` triples: the node is
  that module call's output leaf, or the gradient reaching it (written by
  :mod:`jointlab.trace.probe_hooks` while tracing).
- ``probe_settled``: ``[fqn, call, leaf]`` triples on the last in-place write to
  that module output's storage before the module returned (make_fx: an output
  filled in place, ``out[:, t] = ...``): the ``probe_out`` node holds the
  returned value once this node has run.
- ``fwd_twin``: on a backward node, the forward node whose gradient it computes
  (its module and source are the twin's).
- ``grad_acc_of``: on a gradient-accumulation add, the forward value whose
  gradient terms it sums.
- ``recompute``: True on a backward-phase node that gradient checkpointing
  (``torch.utils.checkpoint``) runs again to recompute the forward of a
  checkpointed region, including the generator-state reads and writes that
  replay its random draws; False on every other node.
- ``dtensor``: on a placeholder traced from a DTensor, this rank's shard:
  ``local_shape``, ``global_shape``, ``placement``, ``mesh_dim`` and
  ``storage_bytes`` (the storage holding the shard, padded where torch pads it).

Keys written by :func:`jointlab.passes.analyze.ensure_analyzed` (cost and storage):

- ``target`` (``aten.mm``), ``category`` (matmul, conv, pointwise, ...).
- ``shape``, ``dtype``, ``numel``: of the output (multi-output: of the first);
  ``out_bytes``: size of all its outputs.
- ``storage``: the node that allocated the storage the output lives in;
  ``bytes``: what the node newly allocates (0 for an alias);
  ``is_view`` / ``alias_of``: it shares an earlier node's storage.
- ``inplace``: the op writes one of its inputs.
- ``flops``: from ``torch.utils.flop_counter``'s registry (and the formulas a
  newer torch has), 0 for ops torch's counter does not count (pointwise,
  views, copies...); ``flops_unknown``: the formula failed on this node, or a
  matmul/conv/attention op has none, so its count is unknown (``flops`` is 0
  there and any total is a lower bound).
- ``saved_for_backward``: the node owns a forward storage the backward reads
  (marked once per storage, on its allocating node; views are never marked).

:class:`NodeInfo` is the typed view of all of these, with the one default of
each key; readers use :func:`node_info` (or the small getters below) instead
of indexing the dict.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from jointlab.errors import NodeExecutionError
from jointlab.torch_compat import is_op_overload, op_schema

KEY = "jointlab"
TRAIN_FN = "<train_fn>"
#: How every view, table and message spells the root module's own ops (FQN ``""``).
ROOT_LABEL = "(root)"
#: ``node.meta`` tag (written by :mod:`jointlab.passes.recompute`, not under :data:`KEY`) on
#: nodes created while checkpoint recomputes; the annotation pass reads it.
RECOMPUTE_TAG = "jointlab_checkpoint_recompute"
PHASES = ("param", "buffer", "input", "forward", "backward", "output")
#: The phases drawn on the backward side of a graph (the output returns the gradients).
BACKWARD_PHASES = ("backward", "output")


class NodeInfo(NamedTuple):
    """The jointlab annotations of one node, typed and immutable, each with its one default.

    The fields are the keys documented in this module's docstring; a key that
    was never written reads as its default here.
    """

    phase: str = ""
    module: str = ""
    module_type: str = ""
    source: str = ""
    fqn: str = ""
    input_path: str = ""
    grad_of: str | None = None
    input_grad_of: str | None = None
    zero_grad: bool = False
    recompute: bool = False
    dtensor: dict[str, Any] | None = None
    fwd_twin: str | None = None
    grad_acc_of: str | None = None
    probe_out: tuple[Any, ...] = ()
    probe_grad: tuple[Any, ...] = ()
    probe_settled: tuple[Any, ...] = ()
    target: str = ""
    category: str = "other"
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    numel: int = 0
    out_bytes: int = 0
    storage: str = ""
    bytes: int = 0
    is_view: bool = False
    alias_of: str | None = None
    inplace: bool = False
    flops: int = 0
    flops_unknown: bool = False
    saved_for_backward: bool = False


_FIELDS = frozenset(NodeInfo._fields)
#: The one default of every key (what :class:`NodeInfo` reads for an unwritten key).
DEFAULTS: dict[str, Any] = dict(NodeInfo._field_defaults)


def node_info(node: fx.Node) -> NodeInfo:
    """The typed annotations of ``node`` (every field at its default if never annotated).

    Args:
        node: A graph node.

    Returns:
        A :class:`NodeInfo`.
    """
    m = node.meta.get(KEY)
    if not m:
        return NodeInfo()
    try:
        return NodeInfo(**m)
    except TypeError:  # a key outside the schema (e.g. written by a user's own pass)
        return NodeInfo(**{k: v for k, v in m.items() if k in _FIELDS})


def storage_owner(node: fx.Node) -> str:
    """Name of the node whose storage ``node``'s output lives in (its own name if fresh)."""
    return info(node).get("storage") or node.name


def info(node: fx.Node) -> dict[str, Any]:
    """Return the jointlab annotations of ``node`` (empty if never annotated)."""
    return node.meta.get(KEY, {})


def phase(node: fx.Node) -> str:
    """Return the node's phase."""
    return info(node).get("phase", "")


def module(node: fx.Node) -> str:
    """Return the FQN of the module the node belongs to."""
    return info(node).get("module", "")


def is_recompute(node: fx.Node) -> bool:
    """True for a backward node that recomputes checkpointed forward work."""
    return bool(info(node).get("recompute", False))


def is_forward(node: fx.Node) -> bool:
    """True for a forward compute node."""
    return phase(node) == "forward"


def is_backward(node: fx.Node) -> bool:
    """True for a backward compute node."""
    return phase(node) == "backward"


def is_state_input(node: fx.Node) -> bool:
    """True for a parameter or buffer placeholder."""
    return phase(node) in ("param", "buffer")


def in_module(module_fqn: str, prefix: str) -> bool:
    """The one module-prefix predicate: ``module_fqn`` is ``prefix`` or one of its submodules.

    ``""`` (the root module's own ops) and :data:`TRAIN_FN` match only
    themselves: ``"h.1"`` matches ``"h.1"`` and ``"h.1.attn"``, never ``"h.10"``.

    Args:
        module_fqn: A node's ``module`` annotation.
        prefix: The module FQN asked about.

    Returns:
        Whether the module lies at or below ``prefix``.
    """
    if module_fqn == prefix:
        return True
    if prefix in ("", TRAIN_FN):
        return False
    return module_fqn.startswith(prefix + ".")


def module_label(fqn: str) -> str:
    """The one display spelling of a module FQN: :data:`ROOT_LABEL` for the root ``""``."""
    return fqn or ROOT_LABEL


def module_names(fqns: Iterable[str]) -> set[str]:
    """Every module FQN a ``module=`` filter can name: the given FQNs and their parents."""
    names: set[str] = set()
    for fqn in fqns:
        names.add(fqn)
        parts = fqn.split(".")
        names.update(".".join(parts[:k]) for k in range(1, len(parts)))
    return names


def did_you_mean(word: str, candidates: Iterable[str], common: list[str]) -> str:
    """``" Did you mean 'a', 'b'?"`` for the names nearest ``word``, else ``common`` ones.

    A candidate that ends with ``"." + word`` (``transformer.h.0.attn`` for
    ``h.0.attn``: the name below a wrapper) comes first, then difflib's nearest.

    Args:
        word: The misspelt name.
        candidates: The names that exist.
        common: Names to list when none is close.

    Returns:
        A sentence to append to an error message (with a leading space).
    """
    names = sorted(c for c in candidates if c)
    suffix = sorted((c for c in names if c.endswith("." + word)), key=len)
    close = suffix[:3] or difflib.get_close_matches(word, names, n=3, cutoff=0.5)
    if close:
        return " Did you mean " + ", ".join(repr(c) for c in close) + "?"
    return f" The graph has, for example, {', '.join(repr(c) for c in common[:8])}."


def is_aten_op(node: fx.Node) -> bool:
    """True for a ``call_function`` node whose target is an operator overload."""
    return node.op == "call_function" and is_op_overload(node.target)


def op_name(node: fx.Node) -> str:
    """The one op-name helper: the op without namespace or overload (``mm``, ``add_``).

    Placeholders and the output node give their FX op; other callables their
    ``__name__``.

    Args:
        node: A graph node.

    Returns:
        The short op name.
    """
    if is_aten_op(node):
        return op_schema(node.target).name.split("::")[-1]
    if node.op in ("placeholder", "output"):
        return node.op
    return getattr(node.target, "__name__", str(node.target))


def value_name(node: fx.Node) -> str:
    """The name a user knows a node's value by: ``transformer.h.0.ln_1.weight``, ``batch.x``.

    A parameter or buffer placeholder gives its state FQN, a user input its input
    path; every other node (and an unannotated placeholder) its graph name.

    Args:
        node: A graph node.

    Returns:
        The name.
    """
    m = info(node)
    return str(m.get("fqn") or m.get("input_path") or node.name)


def _dropout_p(node: fx.Node) -> Any:
    """The ``dropout_p`` argument of ``node``'s op (None when it has none)."""
    names = [a.name for a in op_schema(node.target).arguments]
    if "dropout_p" not in names:
        return None
    i = names.index("dropout_p")
    return node.kwargs.get("dropout_p", node.args[i] if i < len(node.args) else 0.0)


def draws_random(node: fx.Node) -> bool:
    """True for an op that draws random numbers when it runs.

    That is an op tagged ``nondeterministic_seeded``, except attention called
    with ``dropout_p=0``: its CPU kernels carry the tag but draw nothing.

    Args:
        node: A graph node.

    Returns:
        Whether running the node consumes random numbers.
    """
    if node.op != "call_function" or not is_op_overload(node.target):
        return False
    if torch.Tag.nondeterministic_seeded not in node.target.tags:
        return False
    return _dropout_p(node) not in (0, 0.0)


def graph_draws_random(graph: fx.Graph) -> bool:
    """True when any node of ``graph`` draws random numbers (:func:`draws_random`)."""
    return any(draws_random(n) for n in graph.nodes)


def op_aliases(node: fx.Node) -> set[str]:
    """Every spelling a user may give for the node's op: ``aten.mm.default``, ``aten.mm``, ``mm``.

    Args:
        node: A graph node.

    Returns:
        The accepted names.
    """
    names = {str(node.target), getattr(node.target, "__name__", ""), op_name(node)}
    if is_aten_op(node):
        names.add(f"{node.target.namespace}.{op_name(node)}")
    return names - {""}


def node_error(node: fx.Node, exc: BaseException, doing: str = "") -> NodeExecutionError:
    """The error for a node that raised: its name, module, source and ``format_node()``.

    Args:
        node: The failing node.
        exc: What it raised.
        doing: Optional context, e.g. ``"while measuring memory"``.

    Returns:
        A :class:`jointlab.errors.NodeExecutionError` to raise ``from exc``.
    """
    meta = info(node)
    mod = meta.get("module", "")
    src = meta.get("source") or "unknown source"
    when = f" {doing}" if doing else ""
    return NodeExecutionError(
        f"node '{node.name}' of module '{module_label(mod)}' ({meta.get('phase', '?')}, {src}) "
        f"raised {type(exc).__name__}{when}: {exc}\n  {node.format_node()}")


def phase_counts(nodes: Any) -> dict[str, int]:
    """The one count of nodes per phase, in :data:`PHASES` order (zeros kept).

    The DAG title and the summary card both read their phase counts here, so
    they cannot disagree.

    Args:
        nodes: Graph nodes (``joint.graph.nodes``).

    Returns:
        ``{phase: count}`` for every phase in :data:`PHASES`.
    """
    counts = dict.fromkeys(PHASES, 0)
    for n in nodes:
        p = phase(n)
        counts[p] = counts.get(p, 0) + 1
    return counts
