"""Pairing the nodes of two joint graphs and the table of what changed, for ``jl.diff``.

:func:`match_nodes` aligns the nodes of two graphs within each
``(module, phase)`` group by their op names (placeholders by parameter FQN or
input path, the output with the output); :func:`arg_changes` names the
arguments of a matched pair whose values differ, old and new (an argument left
out counts as its schema default); :func:`diff_table` lays out one row per
added, removed or changed node (:data:`DIFF_COLUMNS`).
:mod:`jointlab.analysis.diff` builds :class:`~jointlab.analysis.diff.GraphDiff` from them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch.fx as fx

from jointlab.meta import node_info, op_name
from jointlab.torch_compat import is_op_overload, op_schema

__all__ = ["DIFF_COLUMNS", "ArgChange", "arg_changes", "diff_table", "match_nodes"]

#: Columns of :attr:`GraphDiff.table`.
DIFF_COLUMNS = ("change", "module", "phase", "node_a", "node_b", "op_a", "op_b", "shape_a",
                "shape_b", "dtype_a", "dtype_b", "users_a", "users_b", "what")


@dataclass(frozen=True)
class ArgChange:
    """One argument of a matched node whose value differs between the two graphs.

    Attributes:
        name: The op's name for the argument (``approximate``), or ``argK`` past its schema.
        old: Its value in ``joint_a`` as text (a node by its name; a default as its value).
        new: Its value in ``joint_b`` as text.
    """

    name: str
    old: str
    new: str

    def __str__(self) -> str:
        """``name: old -> new``."""
        return f"{self.name}: {self.old} -> {self.new}"


# -- matching -------------------------------------------------------------------
def _group(node: fx.Node) -> tuple[str, ...]:
    """The group a node is aligned within: placeholders, the output, or (module, phase)."""
    if node.op in ("placeholder", "output"):
        return (node.op,)
    m = node_info(node)
    return ("compute", m.module, m.phase)


def _token(node: fx.Node) -> str:
    """What must be equal for two nodes of a group to be paired."""
    if node.op == "placeholder":
        m = node_info(node)
        return m.fqn or m.input_path or str(node.target)
    return op_name(node)


def _groups(gm: fx.GraphModule) -> dict[tuple[str, ...], list[fx.Node]]:
    out: dict[tuple[str, ...], list[fx.Node]] = {}
    for n in gm.graph.nodes:
        out.setdefault(_group(n), []).append(n)
    return out


def match_nodes(a: fx.GraphModule, b: fx.GraphModule) -> dict[fx.Node, fx.Node]:
    """Pair the nodes of two graphs by module, phase, op and position.

    Args:
        a: The first graph module.
        b: The second graph module.

    Returns:
        Node of ``a`` -> its partner in ``b``, for every matched pair.
    """
    ga, gb = _groups(a), _groups(b)
    pairs: dict[fx.Node, fx.Node] = {}
    for key, seq_a in ga.items():
        seq_b = gb.get(key)
        if not seq_b:
            continue
        sm = difflib.SequenceMatcher(None, [_token(n) for n in seq_a],
                                     [_token(n) for n in seq_b], autojunk=False)
        for i, j, size in sm.get_matching_blocks():
            pairs.update(zip(seq_a[i:i + size], seq_b[j:j + size]))
    return pairs


# -- comparing matched pairs ----------------------------------------------------
def _same_constant(x: Any, y: Any) -> bool:
    if type(x) is not type(y):
        return False
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001  # e.g. a tensor constant: compare its text
        return repr(x) == repr(y)


def _same(x: Any, y: Any, pairs: dict[fx.Node, fx.Node]) -> bool:
    """Whether argument values ``x`` (of graph a) and ``y`` (of b) agree, node for partner."""
    if isinstance(x, fx.Node) or isinstance(y, fx.Node):
        return isinstance(x, fx.Node) and pairs.get(x) is y
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_same(p, q, pairs) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k], pairs) for k in x)
    return _same_constant(x, y)


def _same_args(a: fx.Node, b: fx.Node, pairs: dict[fx.Node, fx.Node]) -> bool:
    """Whether ``a``'s args and kwargs are ``b``'s, node for partner node."""
    return _same(a.args, b.args, pairs) and _same(a.kwargs, b.kwargs, pairs)


_NOT_GIVEN = object()


def _schema_args(node: fx.Node) -> list[Any]:
    if node.op == "call_function" and is_op_overload(node.target):
        return list(op_schema(node.target).arguments)
    return []


def _named_args(node: fx.Node) -> dict[str, Any]:
    """Arguments by the op's names (``argK`` past the schema); left-out ones as defaults."""
    schema = _schema_args(node)
    names = [a.name for a in schema]
    out = {names[k] if k < len(names) else f"arg{k}": v for k, v in enumerate(node.args)}
    out.update(node.kwargs)
    for a in schema:
        if a.name not in out and a.has_default_value():
            out[a.name] = a.default_value
    return out


def _show(v: Any) -> str:
    """An argument value as text: a node by name, a string bare, containers element-wise."""
    if v is _NOT_GIVEN:
        return "(not given)"
    if isinstance(v, fx.Node):
        return v.name
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_show(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, str):
        return v
    return repr(v)


def arg_changes(a: fx.Node, b: fx.Node, pairs: dict[fx.Node, fx.Node]
                ) -> tuple[ArgChange, ...]:
    """The arguments of a matched pair whose values differ, with old and new values.

    Args:
        a: A node of the first graph.
        b: Its partner in the second graph.
        pairs: Node of the first graph -> its partner (:func:`match_nodes`).

    Returns:
        One :class:`ArgChange` per differing argument, in argument order.
    """
    na, nb = _named_args(a), _named_args(b)
    out = []
    for name in dict.fromkeys([*na, *nb]):
        x, y = na.get(name, _NOT_GIVEN), nb.get(name, _NOT_GIVEN)
        if x is _NOT_GIVEN or y is _NOT_GIVEN or not _same(x, y, pairs):
            out.append(ArgChange(name, _show(x), _show(y)))
    return tuple(out)


def _what_changed(a: fx.Node, b: fx.Node, pairs: dict[fx.Node, fx.Node]) -> list[str]:
    ma, mb = node_info(a), node_info(b)
    what = []
    if a.target != b.target and a.op != "placeholder":
        what.append("target")
    if ma.shape != mb.shape:
        what.append("shape")
    if ma.dtype != mb.dtype:
        what.append("dtype")
    if not _same_args(a, b, pairs):
        what.append("args")
    if {pairs.get(u) for u in a.users} != set(b.users):
        what.append("users")
    return what


def _row(change: str, a: fx.Node | None, b: fx.Node | None, what: list[str]) -> dict[str, Any]:
    ref = b if b is not None else a
    m = node_info(ref)
    row: dict[str, Any] = {"change": change, "module": m.module, "phase": m.phase}
    for side, n in (("a", a), ("b", b)):
        mi = node_info(n) if n is not None else None
        row[f"node_{side}"] = n.name if n is not None else None
        row[f"op_{side}"] = op_name(n) if n is not None else None
        row[f"shape_{side}"] = mi.shape if mi is not None else None
        row[f"dtype_{side}"] = mi.dtype if mi is not None else None
        row[f"users_{side}"] = tuple(u.name for u in n.users) if n is not None else None
    row["what"] = ", ".join(what)
    return row


def diff_table(a: fx.GraphModule, b: fx.GraphModule, pairs: dict[fx.Node, fx.Node],
               args_out: dict[str, tuple[ArgChange, ...]]) -> pd.DataFrame:
    """Rows in ``b``'s graph order; a removed node right after its preceding match.

    ``args_out`` receives the argument changes of each changed node (by ``b``'s name).
    """
    pos_b = {n: i for i, n in enumerate(b.graph.nodes)}
    keyed: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    anchor = -1
    for k, n in enumerate(a.graph.nodes):
        partner = pairs.get(n)
        if partner is None:
            keyed.append(((anchor, 1, k), _row("removed", n, None, [])))
            continue
        anchor = pos_b[partner]
        what = _what_changed(n, partner, pairs)
        if what:
            keyed.append(((anchor, 0, k), _row("changed", n, partner, what)))
            if "args" in what:
                args_out[partner.name] = arg_changes(n, partner, pairs)
    matched_b = set(pairs.values())
    keyed += [((pos_b[n], 0, 0), _row("added", None, n, []))
              for n in b.graph.nodes if n not in matched_b]
    keyed.sort(key=lambda kr: kr[0])
    return pd.DataFrame([r for _, r in keyed], columns=list(DIFF_COLUMNS))
