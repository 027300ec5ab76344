"""Kernel by kernel: the first Inductor kernel whose outputs differ from the uncompiled values.

``jl.compare(compiled, model, inputs)`` calls :func:`first_diverging_kernel`
when a compiled candidate does not match. It reruns **the code Inductor
generated for the whole graph** (the same kernels, the same fusion), with a
probe after each kernel call that copies the buffers the call writes: the
non-``const`` pointer arguments of a C++ kernel, ``out=`` of an extern call,
the results of a fallback op. Each buffer holds the value of one node of the
graph Inductor lowered (its post-grad graph, after decompositions and pattern
passes; Inductor's ``origin_node``), so the reference is that graph run
eagerly, ATen op by ATen op, on the same inputs. The first kernel, in the order
the generated code runs them, with a buffer beyond the dtype-aware tolerances
(relative to the magnitudes that produced its value,
:mod:`jointlab.analysis.compare.scale`, so rounding noise of a sum that
cancels is not a divergence) is named, with the joint-graph nodes and modules
it covers (the kernel map, :mod:`jointlab.analysis.kernels`), their source
lines and its generated code.

What it cannot check it says: buffers whose node is unknown or whose shape
differs are counted as unchecked, a graph with random ops is not probed (the
two runs could draw in another order), and when every kernel matches its
post-grad node while the outputs still differ, the difference arose before
lowering (a decomposition or graph pass), which the result says instead of
naming a kernel. Then :func:`first_decomposed_divergence` names the op: the
post-grad graph's values against the traced graph's, both run eagerly on the
same inputs. Each post-grad node belongs to the last traced node Inductor's
provenance (``postToPre``) derives it from (a decomposed ``gelu``'s ``mul`` and
``erf`` to the ``gelu``, a pattern's ``addmm`` to the ``add`` it ends in, never
to the ``mm`` it consumed), and those read outside their group hold that traced
node's results (each part of a tuple-valued op such as
``native_layer_norm_backward`` is matched by shape and value).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import operator
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from jointlab import meta as _meta
from jointlab.analysis.compare.judge import Tolerance, close, errors
from jointlab.analysis.compare.scale import produced_scale
from jointlab.analysis.kernels import kernel_map, kernel_table
from jointlab.analysis.step.runner import ValueRecorder
from jointlab.analysis.value_stats import SAME_VALUES
from jointlab.meta import ROOT_LABEL, graph_draws_random, module_label

__all__ = ["DecomposedDivergence", "KernelCheck", "KernelDivergence",
           "first_decomposed_divergence", "first_diverging_kernel", "kernel_calls"]

_HANDLE = re.compile(r"^(\s*)# \[Provenance debug handles\] (\S+)\s*$")
_SIGNATURE = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\((\[.*?\]), r'''", re.M)
_BUF = re.compile(r"\b(buf\d+)\b")
_ASSIGN = re.compile(r"^\s*(buf\d+) = ")
_ITEM = re.compile(r"^\s*(buf\d+) = (buf\d+)\[\d+\]\s*$")


@dataclass(frozen=True)
class KernelDivergence:
    """The first kernel call whose written buffers differ from the uncompiled values.

    Attributes:
        kernel: The kernel call (``name:call number``, as in the kernel table).
        kind: ``extern``, ``fused reduction`` or ``fused pointwise``.
        buffer: The first diverging buffer it wrote, and ``node``: the post-grad node it holds.
        nodes: Joint-graph nodes the kernel covers, ``modules`` their modules and
            ``sources`` their source lines.
        code: The kernel's generated source (the call name for an extern call).
        written_before: Earlier kernel calls that also wrote ``buffer`` (an accumulation
            started there, say): the error may come from them too.
        traced: The joint-graph node whose result ``node`` holds (Inductor's
            provenance, :func:`traced_owner`); empty when the provenance has none.
    """

    kernel: str
    kind: str
    buffer: str
    node: str
    nodes: tuple[str, ...]
    modules: tuple[str, ...]
    sources: tuple[str, ...]
    code: str
    max_abs_err: float
    max_rel_err: float
    written_before: tuple[str, ...] = ()
    traced: str = ""

    def __str__(self) -> str:
        """One line: kernel, kind, nodes, modules, source lines and the error."""
        also = (f"; {self.buffer} was also written earlier by {', '.join(self.written_before)}"
                if self.written_before else "")
        return (f"{self.kernel} ({self.kind}; completes {self.buffer} = {self.node}{also}) "
                "covering "
                f"{', '.join(self.nodes) or 'no mapped node'}; modules "
                f"{', '.join(map(module_label, self.modules)) or ROOT_LABEL}; source "
                f"{', '.join(self.sources) or 'unknown'}: max abs err "
                f"{self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}")


@dataclass(frozen=True)
class DecomposedDivergence:
    """The first traced-graph op whose value in Inductor's post-grad graph differs.

    Attributes:
        node: The traced (joint-graph) node, and ``post_node`` the post-grad node
            holding its value after Inductor's decompositions and graph passes.
    """

    node: str
    post_node: str
    max_abs_err: float
    max_rel_err: float

    def __str__(self) -> str:
        """One line: the traced node, the post-grad node and the error."""
        return (f"{self.node} (post-grad {self.post_node}): max abs err "
                f"{self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}")


@dataclass(frozen=True)
class KernelCheck:
    """What the kernel-by-kernel check did.

    Attributes:
        first: The first diverging kernel, or None.
        checked: Kernel calls with at least one buffer compared.
        unchecked: Kernel calls none of whose buffers could be compared.
        note: Why no kernel is named, where none is ("" otherwise).
        decomposed: Where every kernel matched: the first traced op whose
            post-grad value differs (the bug arose before lowering), or None.
    """

    first: KernelDivergence | None
    checked: int
    unchecked: tuple[str, ...]
    note: str = ""
    decomposed: DecomposedDivergence | None = None


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of the generated wrapper: its handle, line and written buffers."""

    kernel: str
    line: int
    writes: tuple[str, ...]
    indent: str = ""
    start: int = 0  # the line of its provenance handle


def _written(call: str, signatures: dict[str, list[str]]) -> list[str]:
    """Buffers a kernel-call line writes (non-const pointers, ``out=``, assignment)."""
    if m := re.search(r"\bout=(buf\d+)\b", call):
        return [m.group(1)]
    if m := _ASSIGN.match(call):
        return [m.group(1)]
    name = call.strip().split("(", 1)[0]
    sig = signatures.get(name)
    if sig is None:  # an unknown call may mutate any buffer it is given
        return list(dict.fromkeys(_BUF.findall(call)))
    args = [a.strip() for a in call.strip()[len(name) + 1:].rsplit(")", 1)[0].split(",")]
    return [a for a, t in zip(args, sig) if _BUF.fullmatch(a) and not t.startswith("const")]


def kernel_calls(source_code: str) -> list[KernelCall]:
    """Every kernel call of Inductor's Python wrapper, in the order it runs them.

    Args:
        source_code: Inductor's generated module.

    Returns:
        One :class:`KernelCall` per provenance handle; ``line`` is where its probe goes.
    """
    signatures = {m.group(1): ast.literal_eval(m.group(2))
                  for m in _SIGNATURE.finditer(source_code)}
    lines = source_code.splitlines()
    calls = []
    for i, line in enumerate(lines):
        m = _HANDLE.match(line)
        if m is None or i + 1 >= len(lines):
            continue
        writes, end = _written(lines[i + 1], signatures), i + 1
        while end + 1 < len(lines) and (_ITEM.match(lines[end + 1])
                                        or lines[end + 1].strip().startswith("assert_")):
            if item := _ITEM.match(lines[end + 1]):
                writes.append(item.group(1))
            end += 1
        calls.append(KernelCall(m.group(2), end, tuple(writes), m.group(1), i))
    return calls


_PLAIN = re.compile(r"^\s*(#|del |return|assert_|buf\d+ = (buf\d+|empty_strided\w*\(|"
                    r"reinterpret_tensor\(|buf\d+\[))")


def unprobed_writes(source_code: str, calls: list[KernelCall]) -> set[str]:
    """Buffers a line of ``call`` other than a probed kernel call may write (never compared)."""
    lines = source_code.splitlines()
    probed = {i for c in calls for i in range(c.start, c.line + 1)}
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("def call("))
    except StopIteration:
        return set()
    out: set[str] = set()
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.startswith(" " * 8) and not line.startswith("\t"):
            break
        if i not in probed and not _PLAIN.match(line) and "(" in line:
            out.update(_BUF.findall(line))
    return out


def instrumented_call(source_code: str, calls: list[KernelCall], probe: Any) -> Any:
    """Inductor's ``call`` with ``probe(kernel, {buffer: value})`` after each kernel call."""
    lines = source_code.splitlines()
    for c in sorted(calls, key=lambda c: c.line, reverse=True):
        bufs = ", ".join(f"{b!r}: {b}" for b in c.writes)
        lines.insert(c.line + 1, f"{c.indent}_jointlab_probe({c.kernel!r}, {{{bufs}}})")
    namespace: dict[str, Any] = {"__name__": "jointlab_kernel_probe",
                                 "_jointlab_probe": probe}
    exec(compile("\n".join(lines), "<jointlab kernel probe>", "exec"), namespace)  # noqa: S102
    return namespace["call"]


def _clones(args: list[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _reference(gm: fx.GraphModule, args: list[Any]) -> dict[str, Any]:
    """Every post-grad node's value, ATen op by ATen op (an FX interpreter)."""
    recorder = ValueRecorder(gm)
    with torch.no_grad():
        recorder.run(*_clones(args))
    return recorder.values


def _probed(compiled: Any, args: list[Any]) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Run the instrumented wrapper once; each kernel call's written buffers, in order."""
    seen: list[tuple[str, dict[str, torch.Tensor]]] = []

    def probe(kernel: str, bufs: dict[str, Any]) -> None:
        seen.append((kernel, {b: v.clone() for b, v in bufs.items()
                              if isinstance(v, torch.Tensor)}))

    code = compiled.compiled.source_code
    call = instrumented_call(code, kernel_calls(code), probe)
    with torch.no_grad():
        call(_clones(args))
    return seen


def _divergence(kernel: str, buf: str, node: str, got: torch.Tensor, want: torch.Tensor,
                compiled: Any) -> KernelDivergence:
    row = kernel_table(compiled).loc[kernel] if kernel in kernel_map(compiled) else None
    nodes = tuple(row["nodes"]) if row is not None else ()
    by_name = {n.name: n for n in compiled.source.graph.nodes}
    sources = tuple(dict.fromkeys(s for n in nodes if (s := _meta.info(by_name[n]).get("source"))))
    abs_err, rel_err, _ = errors(got, want)
    post_to_pre = (compiled.compiled.provenance or {}).get("postToPre", {})
    return KernelDivergence(kernel, row["kind"] if row is not None else "?", buf, node, nodes,
                            tuple(row["modules"]) if row is not None else (), sources,
                            row["source"] if row is not None else "", abs_err, rel_err,
                            traced=_origin_name(traced_owner(post_to_pre.get(node, []),
                                                             by_name), by_name))


def _origin_name(owner: str, by_name: dict[str, fx.Node]) -> str:
    return _value_origin(by_name[owner]).name if owner in by_name else owner


def first_diverging_kernel(compiled: Any, model: nn.Module, inputs: dict[str, Any],
                           tol: Tolerance, seed: int = 0) -> KernelCheck:
    """Rerun ``compiled``'s generated code kernel by kernel against its post-grad graph.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.
        model: The live model (not changed: a deep copy feeds both runs).
        inputs: Keyword inputs for the training step.
        tol: How values are judged (:class:`jointlab.analysis.compare.judge.Tolerance`).
        seed: RNG seed for both runs.

    Returns:
        A :class:`KernelCheck`; ``first`` is None when every checked kernel matched.
    """
    lowered = getattr(compiled.compiled, "lowered", None)
    if not lowered or len(lowered) != 1:
        return KernelCheck(None, 0, (), "no kernel-by-kernel check: Inductor's lowered graph "
                           "was not recorded (another backend, dynamic shapes, or no run yet)")
    gm, buffers = lowered[0]
    if graph_draws_random(gm.graph):
        return KernelCheck(None, 0, (), "no kernel-by-kernel check: the graph has random ops, "
                           "which the probed rerun could draw in another order")
    source = compiled.source
    flat = list(source.runtime.prepare(source, source.flat_args(copy.deepcopy(model), inputs)))
    args = compiled.compiled.code_args(flat)
    cuda = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda})
    with torch.random.fork_rng(devices=cuda):  # the caller's RNG state stays as it was
        torch.manual_seed(seed)
        want = _reference(gm, args)
        torch.manual_seed(seed)
        seen = _probed(compiled, args)
    check = _kernel_check(compiled, gm, buffers, seen, want, tol)
    if check.first is not None:
        return check
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        traced = _reference(source.graph_module, flat)  # the graph before Inductor's passes
    return dataclasses.replace(check, decomposed=first_decomposed_divergence(
        compiled, gm, want, traced, tol))


def _kernel_check(compiled: Any, gm: fx.GraphModule, buffers: dict[str, str],
                  seen: list[tuple[str, dict[str, torch.Tensor]]], want: dict[str, Any],
                  tol: Tolerance) -> KernelCheck:
    """Each probed kernel call's completed buffers against the post-grad values ``want``."""
    calls = kernel_calls(compiled.compiled.source_code)
    last = {b: i for i, c in enumerate(calls) for b in c.writes}
    elsewhere = unprobed_writes(compiled.compiled.source_code, calls)
    checked, unchecked = 0, []
    nodes = {n.name: n for n in gm.graph.nodes}

    def value_of(n: fx.Node) -> Any:
        return want.get(n.name)

    for i, (kernel, bufs) in enumerate(seen):
        # a buffer is compared once complete: after the last kernel call that writes it
        pairs = [(b, buffers[b], v) for b, v in bufs.items() if b in buffers
                 and last.get(b) == i and b not in elsewhere
                 and isinstance(want.get(buffers[b]), torch.Tensor)
                 and want[buffers[b]].shape == v.shape]
        if not pairs:
            unchecked.append(kernel)
            continue
        checked += 1
        bad = [(buf, node, got) for buf, node, got in pairs
               if not close(got, want[node], tol) and not (node in nodes and close(
                   got, want[node], tol, produced_scale(nodes[node], value_of)))]
        if bad:  # of its diverging buffers, the one holding the earliest traced value
            buf, node, got = min(bad, key=lambda b: _traced_order(compiled, b[1]))
            before = tuple(c.kernel for c in calls[:i] if buf in c.writes)
            found = _divergence(kernel, buf, node, got, want[node], compiled)
            return KernelCheck(dataclasses.replace(found, written_before=before),
                               checked, tuple(unchecked))
    return KernelCheck(None, checked, tuple(unchecked))


def _traced_order(compiled: Any, post: str) -> int:
    """Graph position of the traced value post-grad node ``post`` holds (unknown ones last)."""
    by_name = {n.name: n for n in compiled.source.graph.nodes}
    pres = (compiled.compiled.provenance or {}).get("postToPre", {}).get(post, [])
    origin = _origin_name(traced_owner(pres, by_name), by_name)
    return list(by_name).index(origin) if origin in by_name else len(by_name)


def _value_origin(node: fx.Node) -> fx.Node:
    """The op that computed ``node``'s values: back through views, detaches and clones."""
    while (_meta.op_name(node) in SAME_VALUES and node.args
           and isinstance(node.args[0], fx.Node) and node.args[0].op == "call_function"):
        node = node.args[0]
    return node


def _aliases_another(node: fx.Node, pres: list[str]) -> bool:
    """True when ``node`` only passes on another node of ``pres``'s values (rearranged).

    make_fx's ``detach`` of a value saved for the backward, a ``view`` Inductor
    folds into the kernel: a post-grad node derived from one and its argument
    holds the argument's result.
    """
    return (_meta.op_name(node) in SAME_VALUES and bool(node.args)
            and getattr(node.args[0], "name", None) in pres)


def traced_owner(pres: list[str], traced: dict[str, fx.Node]) -> str:
    """The traced node a post-grad node derived from ``pres`` holds the result of.

    The last of ``pres`` in graph order (a pattern's ``addmm`` belongs to the
    ``add`` it ends in) that is not a ``detach`` or view of another of them.

    Args:
        pres: Traced node names Inductor's provenance (``postToPre``) derives it from.
        traced: The traced graph's nodes by name, in graph order.

    Returns:
        The node's name, or ``""`` when no name of ``pres`` is a traced node.
    """
    order = {name: i for i, name in enumerate(traced)}
    pres = [p for p in pres if p in order]
    owners = [p for p in pres if not _aliases_another(traced[p], pres)] or pres
    return max(owners, key=order.__getitem__) if owners else ""


def _group_outputs(compiled: Any, gm: fx.GraphModule) -> dict[str, list[str]]:
    """``{traced node: post-grad nodes holding its results}`` from Inductor's provenance.

    A post-grad node belongs to the last traced node (in graph order) it derives
    from, never to a ``detach`` or view of another of them (a log-softmax's
    result is derived from the ``_log_softmax`` and its ``detach`` nodes: it is
    the ``_log_softmax``'s); it holds a result of that node when a node of another
    group (or the graph's output) reads it.
    """
    post_to_pre = (compiled.compiled.provenance or {}).get("postToPre", {})
    traced = {n.name: n for n in compiled.source.graph.nodes}
    group: dict[fx.Node, str] = {}
    for post in (n for n in gm.graph.nodes if n.op == "call_function"):
        if owner := traced_owner(post_to_pre.get(post.name, []), traced):
            group[post] = owner
    out: dict[str, list[str]] = {}
    for post, owner in group.items():
        if any(group.get(u) != owner for u in post.users):
            out.setdefault(owner, []).append(post.name)
    return out


def first_decomposed_divergence(compiled: Any, gm: fx.GraphModule, post: dict[str, Any],
                                traced: dict[str, Any], tol: Tolerance
                                ) -> DecomposedDivergence | None:
    """The first traced op, in graph order, whose post-grad value differs from its own.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.
        gm: Inductor's post-grad graph.
        post: Its node values, run eagerly (:func:`_reference`).
        traced: The traced graph's node values on the same inputs.
        tol: How values are judged; relative to the magnitudes that produced each
            traced value too (:mod:`jointlab.analysis.compare.scale`).

    Returns:
        The first differing pair, or None when every paired value matches.
    """
    results = _group_outputs(compiled, gm)

    def value_of(n: fx.Node) -> Any:
        return traced.get(n.name)

    for node in compiled.source.graph.nodes:
        want = traced.get(node.name)
        owner = node.args[0] if node.target is operator.getitem else node  # a tuple's part
        cands = [p for p in results.get(getattr(owner, "name", ""), [])
                 if isinstance(want, torch.Tensor) and isinstance(post.get(p), torch.Tensor)
                 and post[p].shape == want.shape]
        scale = produced_scale(node, value_of) if cands else None
        if not cands or any(close(post[p], want, tol) or close(post[p], want, tol, scale)
                            for p in cands):
            continue
        held = min(cands, key=lambda p: errors(post[p], want)[0])
        abs_err, rel_err, _ = errors(post[held], want)
        return DecomposedDivergence(owner.name, held, abs_err, rel_err)
    return None
