"""Memory of one training step, predicted from the joint graph (and measured).

Every node of the joint graph is one *step*. A storage is born at the step of
the node that allocates it and dies at the step after which no variable of
the generated code refers to it any more. The rules mirror
``fx.Graph``'s code generation, which emits ``x = None`` right after a value's
last use:

- placeholders (state and inputs) are held by the caller for the whole run;
- ``get_attr`` constants belong to the module and also live the whole run;
- graph outputs live to the end;
- a value with no users is dropped right after its own step;
- a storage dies when its last alias (view, in-place result, ``getitem``, the
  multi-output tuple that holds it) dies;
- outputs of a multi-output op that no ``getitem`` reads live as long as the
  tuple.

Storage identity (owner, bytes, views, in-place) comes from
:func:`jointlab.passes.analyze.ensure_analyzed`. ``live bytes`` at a step counts
every storage with ``first_step <= step <= last_step``: while a node runs,
its inputs and its new outputs are alive together, which is the step's peak.

:func:`memory_profile` returns a :class:`MemoryProfile`. Given a model and
inputs it also runs the graph and records what was really allocated per step
(see :mod:`jointlab.analysis.memory.measure`).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
import torch.fx as fx

from jointlab.analysis.memory.sizes import Sizes, sizes_for, traced_sizes
from jointlab.inputs import flatten_inputs
from jointlab.meta import KEY
from jointlab.passes.analyze import ensure_analyzed, is_getitem, is_op, tensor_bytes
from jointlab.units import human_bytes

if TYPE_CHECKING:
    from torch import nn

    from jointlab.graph import JointGraph

CATEGORIES = ("param", "buffer", "input", "activation", "temporary", "gradient", "output")
_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to this
# Loss kernels that allocate their result like the unreduced loss, then reduce into it:
# the 0-d output keeps an input-sized storage (checked on torch 2.13, CPU).
_REDUCES_INTO_FULL_BUFFER = {"mse_loss", "smooth_l1_loss", "binary_cross_entropy",
                             "soft_margin_loss"}


# -- small predicates ------------------------------------------------------------
def lives_whole_run(node: fx.Node) -> bool:
    """True for values the caller or the module holds for the whole run."""
    return node.op in ("placeholder", "get_attr")


def is_multi_output(node: fx.Node) -> bool:
    """True for a node whose value is a tuple/list read through ``getitem``."""
    val = node.meta.get("val")
    return isinstance(val, (list, tuple)) and node.op == "call_function"


def has_tensor(node: fx.Node) -> bool:
    """True when the node's value (or first output) is a tensor."""
    return node.meta.get(KEY, {}).get("shape") is not None


def round_alloc(nbytes: int, device: str) -> int:
    """Bytes the allocator of ``device`` really reserves for ``nbytes``."""
    if device.startswith("cuda") and nbytes > 0:
        return math.ceil(nbytes / _CUDA_BLOCK) * _CUDA_BLOCK
    return nbytes


def reduction_arg(node: fx.Node) -> int:
    """The ``reduction`` argument of a loss op (1 = mean when not given)."""
    names = [a.name for a in node.target._schema.arguments]
    k = names.index("reduction")
    if "reduction" in node.kwargs:
        return int(node.kwargs["reduction"])
    return int(node.args[k]) if k < len(node.args) else 1


def reduces_into_full_buffer(node: fx.Node) -> bool:
    """True for a reducing loss op whose output storage is input-sized."""
    return (is_op(node) and node.target._schema.name.split("::")[-1]
            in _REDUCES_INTO_FULL_BUFFER and reduction_arg(node) != 0)


def alloc_bytes(node: fx.Node, sizes: Sizes | None = None) -> int:
    """Bytes the node's fresh storage really takes.

    That is ``bytes`` from the analysis, widened for kernels known to over-allocate.

    Args:
        node: A node of an analyzed graph.
        sizes: Evaluate symbolic sizes at these input sizes (default: trace-time hints).

    Returns:
        Bytes; 0 for a node that allocates nothing (an alias).
    """
    nbytes = int(node.meta.get(KEY, {}).get("bytes", 0))
    if nbytes and sizes is not None:
        nbytes = sizes.out_bytes(node)
    size_of = tensor_bytes if sizes is None else sizes.tensor_bytes
    if nbytes and reduces_into_full_buffer(node):
        src = node.args[0].meta.get("val")
        nbytes = max(nbytes, size_of(src) // src.element_size()
                     * node.meta["val"].element_size())
    return nbytes


# -- liveness ----------------------------------------------------------------------
def variable_deaths(nodes: list[fx.Node]) -> dict[fx.Node, int]:
    """Step after which the generated code drops each node's variable.

    Args:
        nodes: The graph's nodes in order.

    Returns:
        Node -> last step at which its value is still referenced.
    """
    end = len(nodes) - 1
    death: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        death[node] = end if lives_whole_run(node) else i
        for a in node.all_input_nodes:
            if not lives_whole_run(a):
                death[a] = i
    return death


def born_at(node: fx.Node, index: dict[fx.Node, int]) -> int:
    """Step that allocates a node's fresh storage: a ``getitem``'s op allocated it."""
    if is_getitem(node) and isinstance(node.args[0], fx.Node):
        return index[node.args[0]]
    return index[node]


@dataclass
class _Storage:
    owner: str
    birth: int
    death: int
    nbytes: int
    aliases: int = 0
    saved: bool = False
    grad: bool = False
    output: bool = False


def _unread_outputs(node: fx.Node, sizes: Sizes | None = None) -> list[tuple[int, int]]:
    """(index, bytes) of fresh outputs of a multi-output op that no getitem reads."""
    read = {u.args[1] for u in node.users if is_getitem(u)}
    returns = node.target._schema.returns if is_op(node) else None
    out = []
    for i, t in enumerate(node.meta["val"]):
        if i in read or not isinstance(t, torch.Tensor):
            continue
        if returns is not None and i < len(returns) and returns[i].alias_info is not None:
            continue
        out.append((i, tensor_bytes(t) if sizes is None else sizes.tensor_bytes(t)))
    return out


def _is_wait_tensor(node: fx.Node) -> bool:
    return (node.op == "call_function" and "wait_tensor" in str(node.target)
            and bool(node.args) and isinstance(node.args[0], fx.Node))


def storages(joint_or_gm: Any, device: str = "cpu", sizes: Sizes | None = None
             ) -> tuple[list[fx.Node], dict[str, _Storage]]:
    """Every storage of one run with its birth step, death step and size.

    Args:
        joint_or_gm: A JointGraph or a GraphModule with fake ``meta["val"]``.
        device: Device whose allocator rounding to apply (``cuda`` rounds to 512 B).
        sizes: Sizes of a dynamic graph at a call's inputs (default: as traced).

    Returns:
        ``(nodes, {owner name: storage})``.
    """
    gm = getattr(joint_or_gm, "graph_module", joint_or_gm)
    ensure_analyzed(gm)
    nodes = list(gm.graph.nodes)
    death = variable_deaths(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out_node = nodes[-1]
    outputs = set(out_node.all_input_nodes) if out_node.op == "output" else set()
    st: dict[str, _Storage] = {}
    waited: dict[str, str] = {}  # a wait_tensor's storage -> the collective's
    for i, node in enumerate(nodes):
        m = node.meta.get(KEY, {})
        if is_multi_output(node):
            for k, nb in _unread_outputs(node, sizes):
                st[f"{node.name}[{k}]"] = _Storage(f"{node.name}[{k}]", i, death[node],
                                                   round_alloc(nb, device), 1)
            continue
        if not has_tensor(node):
            continue
        owner = m.get("storage", node.name)
        if _is_wait_tensor(node):  # returns the collective's own buffer: an alias
            src = node.args[0].meta.get(KEY, {}).get("storage", node.args[0].name)
            waited[owner] = waited.get(src, src)
        owner = waited.get(owner, owner)
        s = st.get(owner)
        if s is None:
            birth = 0 if lives_whole_run(node) else born_at(node, index)
            s = st[owner] = _Storage(owner, birth, death[node],
                                     round_alloc(alloc_bytes(node, sizes), device))
        d = death[node]
        if is_getitem(node):
            d = max(d, death[node.args[0]])
        s.death = max(s.death, d)
        s.aliases += 1
        s.saved = s.saved or bool(m.get("saved_for_backward"))
        if node in outputs:
            s.death = len(nodes) - 1
            s.output = True
            s.grad = s.grad or "grad_of" in m
    return nodes, st


def storage_category(s: _Storage, owner: fx.Node | None) -> str:
    """One of :data:`CATEGORIES` for a storage."""
    ph = owner.meta.get(KEY, {}).get("phase", "") if owner is not None else ""
    if owner is not None and owner.op == "get_attr":
        return "buffer"
    if ph in ("param", "buffer", "input"):
        return ph
    if s.grad:
        return "gradient"
    if s.output:
        return "output"
    if ph == "forward" and s.saved:
        return "activation"
    return "temporary"


# -- the profile -----------------------------------------------------------------
@dataclass
class MemoryProfile:
    """Predicted (and optionally measured) memory of one ``joint.run``.

    Attributes:
        lifetimes: One row per storage: owner node, op, module, category,
            first/last step, bytes, shape, dtype, number of aliases.
        timeline: One row per node step: node, op, module, phase, shape, live
            bytes per category, ``total``; with ``measured``, ``measured_total``
            and ``workspace`` columns when measured.
        peak_bytes: Predicted peak of live bytes (state and inputs included).
        peak_node: Node at which the predicted peak occurs.
        forward_peak_bytes: Predicted peak over forward steps.
        backward_peak_bytes: Predicted peak over backward steps.
        boundary_step: First backward step (``len(timeline)`` if none).
        device: Device the prediction models (allocator rounding).
        measured_peak_bytes: Measured peak of graph values (kernel workspace excluded).
        measured_total_peak_bytes: Measured peak including workspace.
        workspace_peak_bytes: Largest workspace seen at one step.
        peak_error: ``(predicted - measured) / measured`` of the peak.
        name: Label used in the HTML card (e.g. the model's class).
        input_sizes: The tensor input sizes the prediction is for, by dotted
            path: the traced sizes, or for a dynamic graph those of the
            ``inputs`` given to :func:`memory_profile`.
    """

    lifetimes: pd.DataFrame
    timeline: pd.DataFrame
    peak_bytes: int
    peak_node: str
    forward_peak_bytes: int
    backward_peak_bytes: int
    boundary_step: int
    device: str = "cpu"
    measured_peak_bytes: int | None = None
    measured_peak_node: str | None = None
    measured_total_peak_bytes: int | None = None
    workspace_peak_bytes: int | None = None
    peak_error: float | None = None
    name: str = ""
    input_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _joint: Any = field(default=None, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        """True when the profile holds a measured run."""
        return self.measured_peak_bytes is not None

    def by_category(self, step: int | None = None) -> pd.Series:
        """Live bytes per category at ``step`` (default: the predicted peak).

        Args:
            step: A node step.

        Returns:
            Bytes indexed by category.
        """
        tl = self.timeline
        step = int(tl["total"].to_numpy().argmax()) if step is None else step
        return tl.loc[step, list(CATEGORIES)].astype("int64")

    def what_if(self, budgets: tuple[float, ...] = (1.0, 0.5, 0.2)) -> pd.DataFrame:
        """Saved activations and peak under PyTorch's partitioners (``whatif``).

        Args:
            budgets: Activation-memory budgets for min-cut rematerialisation.

        Returns:
            One row per option.
        """
        from jointlab.analysis.memory.whatif import what_if

        return what_if(self._joint, budgets=budgets)

    def _repr_html_(self) -> str:
        rows = [("peak (predicted)", _fmt(self.peak_bytes)),
                ("at node", html.escape(self.peak_node)),
                ("forward peak", _fmt(self.forward_peak_bytes)),
                ("backward peak", _fmt(self.backward_peak_bytes))]
        if self.measured:
            rows += [("peak (measured)", _fmt(self.measured_peak_bytes)),
                     ("error", f"{100 * (self.peak_error or 0.0):+.2f}%"),
                     ("workspace (largest)", _fmt(self.workspace_peak_bytes or 0))]
        cat = self.by_category()
        rows += [(html.escape(c), _fmt(int(v))) for c, v in cat.items() if v]
        body = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>"
                       for k, v in rows)
        title = html.escape(f"MemoryProfile {self.name}".strip())
        return (f"<div class='jointlab-memory'><b>{title}</b> "
                f"({len(self.timeline)} steps, {len(self.lifetimes)} storages, "
                f"{html.escape(self.device)})<table>{body}</table></div>")


def _fmt(n: int | None) -> str:
    return "-" if n is None else human_bytes(n)


def _shape(node: fx.Node, sizes: Sizes | None) -> Any:
    if sizes is None:
        return node.meta.get(KEY, {}).get("shape")
    return sizes.shape(node)


def lifetimes_table(nodes: list[fx.Node], st: dict[str, _Storage],
                    sizes: Sizes | None = None) -> pd.DataFrame:
    """One row per storage (see :attr:`MemoryProfile.lifetimes`)."""
    by_name = {n.name: n for n in nodes}
    rows = []
    for s in st.values():
        base = s.owner.split("[", 1)[0]
        node = by_name.get(base)
        m = node.meta.get(KEY, {}) if node is not None else {}
        rows.append((s.owner, m.get("target", ""), m.get("module", ""),
                     storage_category(s, node), m.get("phase", ""), s.birth, s.death,
                     s.nbytes, str(_shape(node, sizes)) if s.owner == base else "",
                     m.get("dtype", ""), s.aliases))
    cols = ["storage", "op", "module", "category", "phase", "first_step", "last_step",
            "bytes", "shape", "dtype", "aliases"]
    return pd.DataFrame(rows, columns=cols)


def timeline_table(nodes: list[fx.Node], life: pd.DataFrame,
                   sizes: Sizes | None = None) -> pd.DataFrame:
    """Live bytes per category at every step (see :attr:`MemoryProfile.timeline`)."""
    n = len(nodes)
    data: dict[str, Any] = {
        "node": [x.name for x in nodes],
        "op": [x.meta.get(KEY, {}).get("target", x.op) for x in nodes],
        "module": [x.meta.get(KEY, {}).get("module", "") for x in nodes],
        "phase": [x.meta.get(KEY, {}).get("phase", "") for x in nodes],
        "shape": [str(_shape(x, sizes) or "") for x in nodes],
    }
    births = life["first_step"].to_numpy()
    deaths = life["last_step"].to_numpy()
    nbytes = life["bytes"].to_numpy(dtype=np.int64)
    cats = life["category"].to_numpy()
    total = np.zeros(n, dtype=np.int64)
    for c in CATEGORIES:
        sel = cats == c
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, births[sel], nbytes[sel])
        np.add.at(diff, deaths[sel] + 1, -nbytes[sel])
        data[c] = np.cumsum(diff[:n])
        total += data[c]
    data["total"] = total
    df = pd.DataFrame(data)
    df.index.name = "step"
    return df


def predict(joint_or_gm: Any, device: str = "cpu", name: str = "",
            sizes: Sizes | None = None) -> MemoryProfile:
    """Predict the memory of one run of a joint graph from its annotations.

    Args:
        joint_or_gm: A JointGraph (or a GraphModule with fake values).
        device: Device whose allocator rounding to model.
        name: Label for the HTML card.
        sizes: For a dynamic graph, the sizes to predict at (default: the traced ones).

    Returns:
        A :class:`MemoryProfile` without measured columns.
    """
    nodes, st = storages(joint_or_gm, device, sizes)
    life = lifetimes_table(nodes, st, sizes)
    tl = timeline_table(nodes, life, sizes)
    total = tl["total"].to_numpy()
    phases = tl["phase"].to_numpy()
    bwd = np.flatnonzero(phases == "backward")
    boundary = int(bwd[0]) if len(bwd) else len(nodes)
    peak = int(total.argmax()) if len(total) else 0
    return MemoryProfile(
        lifetimes=life, timeline=tl, peak_bytes=int(total.max(initial=0)),
        peak_node=nodes[peak].name if nodes else "",
        forward_peak_bytes=int(total[:boundary].max(initial=0)),
        backward_peak_bytes=int(total[boundary:].max(initial=0)),
        boundary_step=boundary, device=device, name=name,
        input_sizes=_input_sizes(joint_or_gm, sizes),
        _joint=joint_or_gm if hasattr(joint_or_gm, "graph_module") else None)


def _input_sizes(joint_or_gm: Any, sizes: Sizes | None) -> dict[str, tuple[int, ...]]:
    if sizes is not None:
        return dict(sizes.inputs)
    if not hasattr(joint_or_gm, "graph_module"):
        return {}
    return traced_sizes(joint_or_gm)


def attach_measurement(profile: MemoryProfile, measured: pd.DataFrame) -> MemoryProfile:
    """Add measured per-step columns and the peak error to ``profile`` (in place).

    Args:
        profile: A predicted profile.
        measured: From :func:`jointlab.analysis.memory.measure.measure`: one row per step with
            ``measured`` (graph values), ``measured_total`` and ``workspace``.

    Returns:
        The same profile.
    """
    tl = profile.timeline
    for col in ("measured", "measured_total", "workspace"):
        tl[col] = measured[col].to_numpy()
    meas = tl["measured"].to_numpy()
    step = int(meas.argmax())
    profile.measured_peak_bytes = int(meas[step])
    profile.measured_peak_node = str(tl["node"].iloc[step])
    profile.measured_total_peak_bytes = int(tl["measured_total"].max())
    profile.workspace_peak_bytes = int(tl["workspace"].max())
    profile.peak_error = (profile.peak_bytes - profile.measured_peak_bytes) / max(
        profile.measured_peak_bytes, 1)
    return profile


def memory_profile(joint: JointGraph, model: nn.Module | None = None,
                   inputs: dict[str, Any] | None = None, device: str | None = None
                   ) -> MemoryProfile:
    """Predict, and with ``model`` and ``inputs`` also measure, one run's memory.

    Args:
        joint: The traced joint graph.
        model: Run the graph on this model to measure what is really allocated.
        inputs: Inputs for the measured run (required with ``model``). For a
            dynamic graph the prediction is made at their sizes too.
        device: Device to model and measure on; defaults to the model's (or CPU).

    Returns:
        A :class:`MemoryProfile`.

    Raises:
        ValueError: ``model`` is given without ``inputs`` or the reverse.
    """
    if (model is None) != (inputs is None):
        raise ValueError("joint.memory(): pass both model= and inputs= to measure, or neither")
    if device is None:
        p = next(iter(model.parameters()), None) if model is not None else None
        device = p.device.type if p is not None else "cpu"
    name = type(model).__name__ if model is not None else ""
    prof = predict(joint, device=str(device), name=name, sizes=_call_sizes(joint, inputs))
    prof._joint = joint
    if model is None:
        return prof
    from jointlab.analysis.memory.measure import measure

    return attach_measurement(prof, measure(joint, model, inputs, device=str(device)))


def _call_sizes(joint: JointGraph, inputs: dict[str, Any] | None) -> Sizes | None:
    """Sizes of a dynamic graph at ``inputs`` (None: static, or no inputs)."""
    if inputs is None or getattr(joint, "guards", None) is None:
        return None
    leaves, _ = flatten_inputs(inputs)
    return sizes_for(joint, {p: v for p, v in leaves if isinstance(v, torch.Tensor)})
