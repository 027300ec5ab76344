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

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from jointlab import meta as _meta
from jointlab.analysis.compare.judge import Tolerance, close, errors
from jointlab.analysis.compare.scale import produced_scale
from jointlab.analysis.kernel_wrapper import instrumented_call, kernel_calls, unprobed_writes
from jointlab.analysis.kernels import kernel_map, kernel_table
from jointlab.analysis.post_grad import DecomposedDivergence as DecomposedDivergence
from jointlab.analysis.post_grad import first_decomposed_divergence, origin_name, traced_owner
from jointlab.analysis.step.runner import ValueRecorder
from jointlab.meta import ROOT_LABEL, graph_draws_random, module_label

__all__ = ["DecomposedDivergence", "KernelCheck", "KernelDivergence",
           "first_decomposed_divergence", "first_diverging_kernel", "kernel_calls"]


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
                            traced=origin_name(traced_owner(post_to_pre.get(node, []),
                                                             by_name), by_name))


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
    origin = origin_name(traced_owner(pres, by_name), by_name)
    return list(by_name).index(origin) if origin in by_name else len(by_name)
