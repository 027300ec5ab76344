"""The kernel map: which joint-graph nodes each Inductor kernel of a compiled joint covers.

``joint.compile("inductor")`` hands the traced graph to Inductor directly with
provenance tracking on (:class:`jointlab.analysis.inductor_graph.InductorGraph`), so
Inductor's own records name the traced graph's nodes: each post-grad node
knows the joint-graph nodes it came from (``from_node``), and each kernel the
post-grad nodes it was generated for (fused C++/Triton kernels from their IR
origins, extern calls such as ``mm`` or the attention op from their origin
node). :func:`kernel_table` joins the two: one row per kernel call, in the
order the generated code runs them. :func:`kernel_column` gives the node
table's ``kernel`` column and :func:`kernel_coverage` how complete the map is:
nodes without a kernel are listed, never guessed. Views, ``getitem`` and
allocations usually own no kernel (Inductor folds them into indexing), so
coverage counts compute nodes only.

Inductor's pattern replacements (``mm`` + ``add`` -> ``addmm``) record only the
match's output as the replacement's source, so the nodes they consume (the
tied-weight gradient ``mm`` of a GPT) fell out of the map; the compile runs under
:func:`jointlab.torch_compat.complete_inductor_provenance`, which records them
on the replacement, and Inductor's own mapping carries them to the kernel.

Inductor also adds layout copies (a channels-last copy of a conv weight or of
the input), and gives each the origins of the op that needed it, so the kernel
writing only copies was credited with its consumer's whole fused chain. A
kernel is credited with the nodes whose values it writes: one whose every
written buffer is such a copy (recorded while lowering,
:func:`jointlab.torch_compat.layout_copy_source`) is a ``copy`` kernel that
covers no node; :func:`kernel_copies` says what it copies. A kernel that
writes copies and computed values (a U-Net kernel that computes a ReLU and
transposes the weight gradients of earlier ``convolution_backward`` calls) is
credited with the nodes its computed buffers were made for only: the origins
only its copies bring in are dropped (:func:`copy_only_origins`, from each
buffer's Inductor ``origins``), and the table's ``copies`` column names what it
copies.

Everything here reads; nothing writes ``node.meta``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jointlab import meta as _meta
from jointlab.errors import CompiledGraphError
from jointlab.passes.analyze import require_analyzed
from jointlab.torch_compat import is_op_overload

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["KernelCoverage", "copied_values", "copy_only_origins", "kernel_column",
           "kernel_copies", "kernel_coverage", "kernel_layer", "kernel_map", "kernel_table",
           "phase_label"]

#: Node-table categories that compute values (the rest are views and bookkeeping).
COMPUTE = frozenset({"matmul", "conv", "pointwise", "reduction", "norm", "rng", "copy"})
#: ATen ops of category ``other`` compute too (embedding, cat, nll_loss_backward, ...);
#: ``other`` also holds ``getitem``, which is no ATen op and computes nothing.
OTHER = "other"
#: Allocations (uninitialised memory) compute nothing, whatever their category.
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                         "new_empty_strided"})
#: Reshapes of a fresh tensor: views in all but schema (Inductor reinterprets the buffer).
RESHAPES = frozenset({"_unsafe_view", "_reshape_alias"})


def is_compute(node: Any) -> bool:
    """True for a call that computes values: not a view, ``getitem`` or an allocation.

    That is a :data:`COMPUTE` category, or an ATen op of category ``other`` that is
    not one of :data:`RESHAPES`.
    """
    if node.op != "call_function" or _meta.op_name(node) in ALLOCATIONS | RESHAPES:
        return False
    cat = _meta.info(node).get("category")
    return cat in COMPUTE or (cat == OTHER and is_op_overload(node.target))


#: The order phases are named in a kernel's label: a fused kernel is "forward+backward".
PHASE_ORDER = {"forward": 0, "backward": 1}


def phase_label(nodes: Any) -> str:
    """The phases of ``nodes`` joined by ``+``: forward first, then backward, then others.

    Args:
        nodes: Joint-graph nodes (those a kernel covers).

    Returns:
        For example ``"forward+backward"``; ``""`` when no node has a phase. The
        kernel table and :func:`jointlab.analysis.step.kernel_timing.kernel_timings`
        both label phases this way.
    """
    phases = {_meta.phase(n) for n in nodes} - {""}
    return "+".join(sorted(phases, key=lambda p: (PHASE_ORDER.get(p, len(PHASE_ORDER)), p)))


def is_extern(kernel: str) -> bool:
    """True for a call Inductor leaves to an existing kernel (``extern_kernels.mm``, aten ops)."""
    return kernel.startswith(("extern_kernels.", "torch.ops.", "aten."))


def _provenance(compiled: Any) -> dict[str, Any]:
    inner = getattr(compiled, "compiled", None)
    prov = getattr(inner, "provenance", None)
    if prov is None:
        why = ("it has not run yet: call compiled.run(model, inputs) once first"
               if hasattr(inner, "provenance") else
               f"it was compiled with backend={getattr(compiled, 'backend', '?')!r} or "
               "traced with dynamic shapes; only joint.compile('inductor') on a static "
               "graph records Inductor's provenance")
        raise CompiledGraphError(f"no kernel map for this compiled joint: {why}")
    return prov


def kernel_writes(compiled: Any) -> dict[str, tuple[str, ...]]:
    """``kernel call -> buffers it writes``, read from the generated code (cut once)."""
    return {p.kernel: p.writes for p in compiled.compiled.kernel_pieces()}


def copied_values(compiled: Any) -> dict[str, tuple[str, ...]]:
    """``kernel call -> what it copies`` for every kernel that writes a layout copy.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        Per kernel writing at least one layout copy, the values its copies hold: a
        graph input by its placeholder's FQN or input path, another buffer by the
        node it holds (else the buffer's name).
    """
    _provenance(compiled)
    copies = getattr(compiled.compiled, "copies", {})
    inputs = {n.name: _meta.info(n).get("fqn") or _meta.info(n).get("input_path") or n.name
              for n in compiled.source.graph.find_nodes(op="placeholder")}
    held = {b: origin[0] for b, origin in compiled.compiled.buffers.items()}
    for copy, src in copies.items():  # a node's value copied out of an unnamed buffer
        if copy in held and src not in held:
            held[src] = held[copy]

    def name(buf: str) -> str:
        while buf in copies and buf not in held:  # a copy of a copy: name the original
            buf = copies[buf]
        return inputs.get(buf) or held.get(buf, buf)
    return {k: tuple(dict.fromkeys(name(copies[b]) for b in writes if b in copies))
            for k, writes in kernel_writes(compiled).items()
            if any(b in copies for b in writes)}


def kernel_copies(compiled: Any) -> dict[str, tuple[str, ...]]:
    """``kernel call -> what it copies`` for the kernels that write only layout copies.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        Per copy kernel, the values it copies (see :func:`copied_values`).
    """
    copies = getattr(compiled.compiled, "copies", {})
    writes = kernel_writes(compiled)
    return {k: v for k, v in copied_values(compiled).items()
            if all(b in copies for b in writes[k])}


def copy_only_origins(compiled: Any) -> dict[str, set[str]]:
    """``kernel call -> post-grad nodes it was credited with only for the copies it writes``.

    Inductor credits a fused kernel with the ``origins`` of every buffer it
    writes, and a layout copy's origins are the nodes whose value it copies or
    the op that needed the copy (a weight gradient transposed after its
    ``convolution_backward``). A post-grad node counts as copied only, for a
    kernel, when it is an origin of a copy that kernel writes and no buffer
    computed for that node (not a copy) is written by this kernel or by none (a
    buffer fused away inside some kernel): such a node keeps its credit.
    """
    inner = compiled.compiled
    copies, origins = inner.copies, getattr(inner, "origins", {})
    writes = kernel_writes(compiled)
    writer = {b: k for k, bufs in writes.items() for b in bufs}
    computed_by: dict[str, set[str]] = {}
    for buf, posts in origins.items():
        if buf not in copies:
            for post in posts:
                computed_by.setdefault(post, set()).add(writer.get(buf, ""))
    out: dict[str, set[str]] = {}
    for kernel, bufs in writes.items():
        made = {p for b in bufs if b in copies for p in origins.get(b, ())}
        out[kernel] = {p for p in made if not computed_by.get(p, set()) & {kernel, ""}}
    return out


def kernel_map(compiled: Any) -> dict[str, list[str]]:
    """``kernel call -> joint-graph node names`` from Inductor's provenance.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        Kernel calls (``name:call number``) in generated-code order, each with the
        joint-graph nodes it covers, in graph order (none for a layout-copy kernel).

    Raises:
        jointlab.errors.CompiledGraphError: No provenance (other backend, dynamic
            shapes, or not run yet).
    """
    prov = _provenance(compiled)
    post_to_pre = prov.get("postToPre", {})
    order = {n.name: i for i, n in enumerate(compiled.source.graph.nodes)}
    copy_kernels, copied = kernel_copies(compiled), copy_only_origins(compiled)
    out: dict[str, list[str]] = {}
    for kernel, posts in prov.get("cppCodeToPost", {}).items():
        computes = [p for p in posts if p not in copied.get(kernel, ())]
        pre = {p for post in computes for p in post_to_pre.get(post, []) if p in order}
        out[kernel] = [] if kernel in copy_kernels else sorted(pre, key=order.__getitem__)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0].rpartition(":")[2] or 0)))


def kernel_kind(kernel: str, nodes: list[Any], copies: bool = False) -> str:
    """``extern``, ``copy``, ``fused reduction`` or ``fused pointwise`` for one kernel call."""
    if is_extern(kernel):
        return "extern"
    if copies:
        return "copy"
    cats = {_meta.info(n).get("category") for n in nodes}
    return "fused reduction" if cats & {"reduction", "norm"} else "fused pointwise"


def kernel_source(source_code: str, kernel: str) -> str:
    """The generated source of ``kernel`` (its definition in Inductor's output code)."""
    name = kernel.rpartition(":")[0] or kernel
    if is_extern(kernel):
        return name
    m = re.search(rf"^{re.escape(name)} = .*?'''(.*?)'''", source_code, re.S | re.M)
    return m.group(1).strip() if m else ""


def kernel_table(compiled: Any) -> pd.DataFrame:
    """One row per kernel call: name, kind, nodes, modules, phase, copies, source.

    ``nodes`` are the joint-graph nodes the kernel computes; ``copies`` the values
    it only copies into another layout (:func:`copied_values`), never credited.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        A DataFrame indexed by kernel call, in the order the generated code runs them;
        ``attrs["coverage"]`` holds the :class:`KernelCoverage` of the map.

    Raises:
        jointlab.errors.CompiledGraphError: No kernel map for ``compiled``.
    """
    import pandas as pd

    mapping, copy_kernels = kernel_map(compiled), kernel_copies(compiled)
    copied = copied_values(compiled)
    by_name = {n.name: n for n in compiled.source.graph.nodes}
    code = compiled.compiled.source_code or ""
    rows = []
    for kernel, names in mapping.items():
        nodes = [by_name[n] for n in names]
        mods = sorted({_meta.info(n).get("module", "") for n in nodes} - {""})
        rows.append({"kernel": kernel, "name": kernel.rpartition(":")[0],
                     "kind": kernel_kind(kernel, nodes, kernel in copy_kernels),
                     "nodes": tuple(names), "modules": tuple(mods), "phase": phase_label(nodes),
                     "copies": copied.get(kernel, ()),
                     "source": kernel_source(code, kernel)})
    cols = ["kernel", "name", "kind", "nodes", "modules", "phase", "copies", "source"]
    table = pd.DataFrame(rows, columns=cols).set_index("kernel")
    table.attrs["coverage"] = kernel_coverage(compiled)
    return table


def kernel_column(compiled: Any) -> pd.Series:
    """The node table's ``kernel`` column: the kernel calls covering each node.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        A Series indexed by node name (every node of ``compiled.source``): the
        covering kernel calls joined by ``", "``, ``""`` where none does.
    """
    import pandas as pd

    cover: dict[str, list[str]] = {}
    for kernel, names in kernel_map(compiled).items():
        for n in names:
            cover.setdefault(n, []).append(kernel)
    names = [n.name for n in compiled.source.graph.nodes]
    return pd.Series([", ".join(cover.get(n, [])) for n in names], index=names, name="kernel")


def kernel_layer(compiled: Any) -> dict[str, str]:
    """The DAG colour layer of the kernel map: ``{node name: covering kernel calls}``.

    ``jl.dag_view(compiled.source, layers={"kernel": kernel_layer(compiled)},
    color_by="kernel")`` colours each fused group alike; nodes no kernel covers
    are left out (drawn grey, "unknown"), never guessed.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        Covered node names to their :func:`kernel_column` label (calls joined by ``", "``).
    """
    return {name: k for name, k in kernel_column(compiled).items() if k}


@dataclass(frozen=True)
class KernelCoverage:
    """How much of the joint graph's compute the kernel map accounts for.

    Attributes:
        share: Covered compute nodes / compute nodes (1.0 when there are none).
        compute: Number of compute nodes (categories in :data:`COMPUTE`).
        covered: How many of them some kernel or extern call covers.
        unmapped: The compute nodes no kernel covers, in graph order.
    """

    share: float
    compute: int
    covered: int
    unmapped: tuple[str, ...]

    def __str__(self) -> str:
        """``"94/95 compute nodes (98.9%) mapped to a kernel; unmapped: mm_1"``."""
        tail = f"; unmapped: {', '.join(self.unmapped)}" if self.unmapped else ""
        return (f"{self.covered}/{self.compute} compute nodes ({self.share:.1%}) mapped to "
                f"a kernel{tail}")


def kernel_coverage(compiled: Any) -> KernelCoverage:
    """Share of compute nodes (see :data:`COMPUTE`) covered by a kernel or extern call.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.

    Returns:
        A :class:`KernelCoverage`.
    """
    covered = {n for names in kernel_map(compiled).values() for n in names}
    require_analyzed(compiled.source.graph_module)
    compute = [n.name for n in compiled.source.graph.nodes if is_compute(n)]
    unmapped = tuple(n for n in compute if n not in covered)
    share = 1.0 if not compute else (len(compute) - len(unmapped)) / len(compute)
    return KernelCoverage(share, len(compute), len(compute) - len(unmapped), unmapped)
