"""``jl.diff``: what changed between two joint graphs of the same model.

:func:`diff` pairs the nodes of two joint graphs (say, before and after a
user's FX pass or a partition) and lists what was added, removed or changed.
Nodes are matched by module, op and position: within each
``(module, phase)`` group, the two sequences of op names in graph order are
aligned (longest common subsequence, :class:`difflib.SequenceMatcher`), so a
node inserted or fused away in one block leaves the pairing of every other
node intact. Placeholders are matched by their parameter FQN or input path,
the output node with the output node.

A matched pair is *changed* when its target overload, output shape or dtype
differs, when its arguments are not the partners of each other's arguments
(or constants differ), or when its users are not each other's partners.
:attr:`GraphDiff.arg_changes` says which arguments, with the old and new value
of each (by the op's argument names; an argument left out counts as its
schema default), e.g. ``approximate: none -> tanh``.

With ``model`` and ``inputs``, both graphs run one real step through
:func:`jointlab.analysis.record.record` (each on its own deep copy of the
model, from the same seed; the user's model and RNG are left as they were),
and :attr:`GraphDiff.first_value_difference` names the first node of
``joint_b``, in its graph order, whose value differs from its partner's.
Added and removed nodes have no partner and are not compared; a node whose
value is a tuple is compared through its ``getitem`` users, and the output
of an ``empty*`` op (memory nothing wrote yet) is not compared. Values kept
within ``keep_bytes`` per graph are compared; any matched tensor value that
was not kept is listed in :attr:`GraphDiff.not_compared`, so "no difference"
is never claimed for a value that was not looked at.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.fx as fx

from jointlab.analysis.compare.judge import errors as value_errors
from jointlab.analysis.diff_match import DIFF_COLUMNS as DIFF_COLUMNS
from jointlab.analysis.diff_match import ArgChange as ArgChange
from jointlab.analysis.diff_match import arg_changes as arg_changes
from jointlab.analysis.diff_match import diff_table
from jointlab.analysis.diff_match import match_nodes as match_nodes
from jointlab.analysis.record import record
from jointlab.errors import DiffError
from jointlab.meta import module_label, node_info
from jointlab.passes.analyze import graph_fingerprint, require_analyzed, same_version

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import nn

    from jointlab.analysis.record import Record
    from jointlab.core import TracedGraph

__all__ = ["DIFF_COLUMNS", "ArgChange", "GraphDiff", "ValueDifference", "diff"]

_DEFAULT_KEEP = 1 << 30
#: Record notes of values with no defined content (``empty*`` ops).
_UNDEFINED = frozenset({"uninitialized"})


@dataclass(frozen=True)
class ValueDifference:
    """The first matched node whose value differs between the two graphs."""

    node_a: str
    node_b: str
    module: str
    phase: str
    source: str
    max_abs_err: float
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str
    dtype_b: str

    def __str__(self) -> str:
        """One line: the node in both graphs, its module, phase, source and error."""
        names = self.node_b if self.node_a == self.node_b else f"{self.node_a} -> {self.node_b}"
        kind = (f"{self.dtype_a}{list(self.shape_a or ())} vs {self.dtype_b}"
                f"{list(self.shape_b or ())}")
        return (f"{names} (module '{module_label(self.module)}', {self.phase}, "
                f"{self.source or 'no source'}): {kind}, max abs err {self.max_abs_err:.3g}")


@dataclass(frozen=True, eq=False, repr=False)
class GraphDiff:
    """What :func:`diff` found.

    Attributes:
        table: One row per added, removed or changed node (:data:`DIFF_COLUMNS`);
            ``what`` lists the changed fields of a changed node.
        matched: Node of ``joint_a`` -> its partner in ``joint_b``, by name.
        nodes_a: Node count of ``joint_a``.
        nodes_b: Node count of ``joint_b``.
        value_checked: Whether values were compared (``model`` and ``inputs`` given).
        first_value_difference: The first node of ``joint_b`` (graph order)
            whose value differs from its partner's; None when none does or
            values were not compared.
        compared: How many matched values were compared.
        not_compared: Matched nodes of ``joint_b`` with a tensor value that
            was not compared (not kept within the byte budget).
        arg_changes: Changed node of ``joint_b`` (by name) -> its arguments
            whose values differ, old and new (:class:`ArgChange`).
    """

    table: pd.DataFrame
    matched: Mapping[str, str]
    nodes_a: int
    nodes_b: int
    value_checked: bool = False
    first_value_difference: ValueDifference | None = None
    compared: int = 0
    not_compared: tuple[str, ...] = ()
    versions: tuple[Any, Any] = field(default=(None, None), repr=False)
    arg_changes: Mapping[str, tuple[ArgChange, ...]] = field(
        default_factory=lambda: MappingProxyType({}), repr=False)

    def describes(self, joint_a: TracedGraph, joint_b: TracedGraph) -> bool:
        """Whether this diff was computed from these two graphs, as they are now.

        Args:
            joint_a: The graph before.
            joint_b: The graph after.

        Returns:
            False when either is another graph or was edited since.
        """
        return (same_version(self.versions[0], graph_fingerprint(joint_a.graph_module))
                and same_version(self.versions[1], graph_fingerprint(joint_b.graph_module)))

    def _rows(self, change: str) -> pd.DataFrame:
        return self.table[self.table["change"] == change]

    @property
    def added(self) -> pd.DataFrame:
        """Rows of nodes only ``joint_b`` has."""
        return self._rows("added")

    @property
    def removed(self) -> pd.DataFrame:
        """Rows of nodes only ``joint_a`` has."""
        return self._rows("removed")

    @property
    def changed(self) -> pd.DataFrame:
        """Rows of matched nodes that differ."""
        return self._rows("changed")

    @property
    def same(self) -> bool:
        """No structural change and, when values were compared, no value difference."""
        return self.table.empty and self.first_value_difference is None

    def __repr__(self) -> str:
        head = (f"GraphDiff({self.nodes_a} -> {self.nodes_b} nodes: +{len(self.added)} added, "
                f"-{len(self.removed)} removed, ~{len(self.changed)} changed")
        if not self.value_checked:
            return head + "; values not compared (pass model= and inputs=))"
        skipped = f", {len(self.not_compared)} not compared" if self.not_compared else ""
        first = self.first_value_difference
        where = f"first value difference: {first}" if first else "no value differs"
        return f"{head}; {self.compared} values compared{skipped}; {where})"


# -- values ---------------------------------------------------------------------
def _record_copy(joint: TracedGraph, model: nn.Module, inputs: dict[str, Any], seed: int,
                 keep_bytes: int) -> Record:
    """One recorded step of ``joint`` on a deep copy of ``model`` from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return record(joint, copy.deepcopy(model), inputs, keep_bytes=keep_bytes)


def _values_differ(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return True
    if not (x.is_floating_point() or x.is_complex()):
        return not torch.equal(x, y)
    return not bool(torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True).all())


def _first_difference(b_nodes: list[fx.Node], partner_of: dict[fx.Node, fx.Node],
                      rec_a: Record, rec_b: Record, rtol: float, atol: float
                      ) -> tuple[ValueDifference | None, int, list[str]]:
    """Walk ``joint_b`` in graph order; stop at the first matched value that differs."""
    compared, skipped = 0, []
    for nb in b_nodes:
        na = partner_of.get(nb)
        if na is None or nb.op == "output":
            continue
        notes = {rec_a.table.at[na.name, "note"], rec_b.table.at[nb.name, "note"]}
        if notes & _UNDEFINED:  # memory nothing wrote yet: no value to compare
            continue
        if not (na.name in rec_a.values and nb.name in rec_b.values):
            if notes != {"not a tensor"}:
                skipped.append(nb.name)
            continue
        x, y = rec_a.values[na.name], rec_b.values[nb.name]
        compared += 1
        if _values_differ(x, y, rtol, atol):
            err = value_errors(y, x)[0] if x.dtype == y.dtype else value_errors(
                y.double(), x.double())[0]
            m = node_info(nb)
            return (ValueDifference(na.name, nb.name, m.module, m.phase, m.source, err,
                                    tuple(x.shape), tuple(y.shape),
                                    str(x.dtype).removeprefix("torch."),
                                    str(y.dtype).removeprefix("torch.")), compared, skipped)
    return None, compared, skipped


def _check_options(model: Any, inputs: Any, rtol: Any, atol: Any, keep_bytes: Any) -> None:
    if (model is None) != (inputs is None):
        raise DiffError("pass both model= and inputs= to compare values, or neither")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise DiffError(f"{name} must be a non-negative number, got {v!r}")
    if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0:
        raise DiffError(f"keep_bytes must be a non-negative int, got {keep_bytes!r}")


def diff(joint_a: TracedGraph, joint_b: TracedGraph, model: nn.Module | None = None,
         inputs: dict[str, Any] | None = None, *, seed: int = 0, rtol: float = 0.0,
         atol: float = 0.0, keep_bytes: int = _DEFAULT_KEEP) -> GraphDiff:
    """Compare two joint graphs of the same model, node by node.

    Args:
        joint_a: The graph before (e.g. as traced).
        joint_b: The graph after (e.g. after a user's FX pass and ``joint.recompute()``).
        model: The live model; with ``inputs``, both graphs run one step (on
            deep copies) and their values are compared. Left unchanged.
        inputs: Keyword inputs with the traced structure.
        seed: Both steps start from this seed (the global RNG is restored after).
        rtol: Relative tolerance of the value comparison (default exact).
        atol: Absolute tolerance of the value comparison (default exact).
        keep_bytes: Byte budget per graph for the values kept to compare.

    Returns:
        A :class:`GraphDiff`.

    Raises:
        DiffError: Only one of ``model``/``inputs`` was given, or an option is invalid.
        jointlab.errors.StaleAnalysisError: A graph was edited without ``joint.recompute()``.
    """
    _check_options(model, inputs, rtol, atol, keep_bytes)
    ga, gb = joint_a.graph_module, joint_b.graph_module
    require_analyzed(ga)
    require_analyzed(gb)
    pairs = match_nodes(ga, gb)
    args: dict[str, tuple[ArgChange, ...]] = {}
    table = diff_table(ga, gb, pairs, args)
    matched = MappingProxyType({a.name: b.name for a, b in pairs.items()})
    sizes = {"nodes_a": len(ga.graph.nodes), "nodes_b": len(gb.graph.nodes),
             "versions": (graph_fingerprint(ga), graph_fingerprint(gb)),
             "arg_changes": MappingProxyType(args)}
    if model is None:
        return GraphDiff(table, matched, **sizes)
    rec_a = _record_copy(joint_a, model, inputs, seed, keep_bytes)
    rec_b = _record_copy(joint_b, model, inputs, seed, keep_bytes)
    partner_of = {b: a for a, b in pairs.items()}
    first, compared, skipped = _first_difference(list(gb.graph.nodes), partner_of, rec_a,
                                                 rec_b, float(rtol), float(atol))
    return GraphDiff(table, matched, **sizes, value_checked=True, first_value_difference=first,
                     compared=compared, not_compared=tuple(skipped))
