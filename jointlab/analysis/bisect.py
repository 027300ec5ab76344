"""``jl.bisect``: which region of a compiled joint graph diverges from the uncompiled graph.

It works **region by region, not kernel by kernel**. The joint graph
(``compiled.source``) is cut into a few contiguous regions in node order (cuts
fall where the phase or the top-level module changes, so a region stays
inside forward or backward where it can). Each region becomes a graph of its
own, compiled with the same backend; the regions then run in order, each fed
the *uncompiled* graph's values at its inputs, so an error in one region does
not propagate into the next. Each region's outputs are compared with the
uncompiled values under :mod:`jointlab.analysis.compare`'s dtype-aware
tolerances. The result names the first region whose outputs diverge: its
nodes, modules and phase, and, where the whole-graph kernel map exists, the
kernels that cover any of its nodes.

Regions are compiled under the Inductor state ``compiled`` was built with
(its configuration, lowerings and decompositions, recorded when it compiled:
:attr:`jointlab.CompiledJoint.compiler_state`), with every compile cache off,
so a lowering bug patched in for the compile and undone afterwards is still in
what is bisected, and a cached clean region cannot hide one. Where the present
state differs, the result's ``notes`` say what differs. Patches outside those
tables (to Inductor's passes or code generators) are not recorded.

Each region's compiled code is kept with ``compiled`` (keyed by the region's
graph, its input layouts and the compile options): ``compiled.repro`` and a
second ``bisect`` run what was compiled here instead of compiling it again.

Compiling regions apart changes what Inductor may fuse: a bug that only shows
when two regions' ops fuse together is not found here, and the result says
which region, not which kernel, is wrong.
"""

from __future__ import annotations

import contextlib
import copy
import math
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from jointlab import meta as _meta
from jointlab import torch_compat
from jointlab.analysis.compare.judge import Tolerance, close, compute_dtype, errors
from jointlab.analysis.compare.scale import produced_scale
from jointlab.analysis.kernels import kernel_map
from jointlab.analysis.step.runner import ValueRecorder
from jointlab.errors import CompiledGraphError
from jointlab.passes.subgraph import subgraph_module

__all__ = ["Bisection", "Region", "RegionCheck", "bisect", "compile_region", "split_regions"]

_EXACT_RANDOM = {"fallback_random": True}
_NO_CACHES = {"force_disable_caches": True, "fx_graph_cache": False}
# the generated code of a region compiled by Inductor stays readable (compiled.repro writes it)
_PROVENANCE = {"trace.provenance_tracking_level": 1}
# per compiled joint: {region key: compiled region}, and the last bisect's split/options
_REGIONS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Callable[..., Any]]] = \
    weakref.WeakKeyDictionary()
_LAST_SPLIT: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, Any]]] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Region:
    """A contiguous run of the joint graph's nodes, compiled on its own.

    Attributes:
        index: Position in node order (0 first).
        nodes: Its node names, in graph order.
        inputs: Nodes defined before it whose values it reads.
        outputs: Its nodes read after it (by later regions or the graph's output).
        modules: Module FQNs of its nodes, in first-seen order.
        phase: ``"forward"``, ``"backward"`` or both joined by ``"+"``.
        kernels: Whole-graph kernels covering any of its nodes (None: no kernel map).
    """

    index: int
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    modules: tuple[str, ...]
    phase: str
    kernels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RegionCheck:
    """One region output compared with the uncompiled graph's value."""

    region: int
    node: str
    ok: bool
    max_abs: float
    max_rel: float


@dataclass(frozen=True)
class Bisection:
    """What :func:`bisect` found.

    Attributes:
        regions: Every region, in node order.
        checks: One check per region output.
        first: The first region with an output beyond tolerance, or None.
        granularity: Always ``"region"``: regions, not single kernels, are compared.
        notes: How the regions were compiled where that differs from a fresh
            compile now (Inductor's state changed since ``compiled`` was built).
    """

    regions: tuple[Region, ...]
    checks: tuple[RegionCheck, ...]
    first: Region | None
    granularity: str = "region"
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every region matched the uncompiled graph."""
        return self.first is None

    def __str__(self) -> str:
        """One line per region; the first diverging one is marked."""
        lines = [f"bisect ({self.granularity} by region, not by kernel): "
                 + ("clean" if self.ok else f"region {self.first.index} diverges")]
        for r in self.regions:
            bad = [c.node for c in self.checks if c.region == r.index and not c.ok]
            mark = " <- first divergence" if self.first is r else ""
            lines.append(f"  [{r.index}] {r.phase} {len(r.nodes)} nodes "
                         f"{r.nodes[0]}..{r.nodes[-1]} modules={list(r.modules)}"
                         + (f" bad outputs={bad}" if bad else "") + mark)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _is_compute(node: fx.Node) -> bool:
    return node.op not in ("placeholder", "output", "get_attr")


def _key(node: fx.Node) -> tuple[str, str]:
    """Phase and top-level module: cuts prefer to fall where this changes."""
    return _meta.phase(node), _meta.module(node).split(".")[0]


def _cuts(nodes: list[fx.Node], k: int) -> list[list[fx.Node]]:
    """Cut ``nodes`` into about ``k`` contiguous groups, at key changes where possible."""
    size = max(1, math.ceil(len(nodes) / k))
    groups: list[list[fx.Node]] = [[]]
    for node in nodes:
        cur = groups[-1]
        joined = node.op == "call_function" and node.target is operator.getitem
        full = len(cur) >= size or (cur and _key(cur[-1]) != _key(node)
                                    and len(cur) >= size // 2)
        if cur and full and not joined:
            groups.append([])
        groups[-1].append(node)
    return groups


def split_regions(gm: fx.GraphModule, k: int = 6) -> list[Region]:
    """Cut ``gm``'s compute nodes into about ``k`` contiguous regions in node order.

    Args:
        gm: The joint graph module.
        k: How many regions to aim for.

    Returns:
        The regions (``kernels`` left None).
    """
    nodes = [n for n in gm.graph.nodes if _is_compute(n)]
    groups = _cuts(nodes, k)
    where = {n: i for i, g in enumerate(groups) for n in g}
    regions = []
    for i, group in enumerate(groups):
        inside = set(group)
        ins = dict.fromkeys(a.name for n in group for a in n.all_input_nodes if a not in inside)
        outs = [n.name for n in group if any(where.get(u, len(groups)) != i for u in n.users)]
        modules = dict.fromkeys(_meta.module(n) for n in group)
        phases = dict.fromkeys(_meta.phase(n) or "?" for n in group)
        regions.append(Region(i, tuple(n.name for n in group), tuple(ins), tuple(outs),
                              tuple(modules), "+".join(phases)))
    return regions


def region_module(gm: fx.GraphModule, region: Region) -> fx.GraphModule:
    """A graph module computing ``region.outputs`` from ``region.inputs``.

    Built by :func:`jointlab.passes.subgraph.subgraph_module`; ``gm`` is only read.
    """
    return subgraph_module(gm, region.inputs, region.nodes, region.outputs)


def compile_region(backend: str, gm: fx.GraphModule, args: list[Any],
                   options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Compile one region with ``backend`` (Inductor directly, others via ``torch.compile``).

    Args:
        backend: The ``torch.compile`` backend name.
        gm: The region's graph module.
        args: Example inputs (the uncompiled values at its inputs).
        options: Extra Inductor options.

    Returns:
        A callable taking the region's inputs positionally.
    """
    opts = {**_EXACT_RANDOM, **(options or {}), **_NO_CACHES}
    if backend == "inductor":
        with torch.no_grad():
            return torch_compat.inductor_compile(gm, list(args), options=opts)
    return torch.compile(gm, backend=backend)


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, str(value.device))
    return repr(value)


def region_compiled(compiled: Any, gm: fx.GraphModule, region: Region, values: dict[str, Any],
                    state: Any, options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``region`` of ``gm`` compiled under ``state``, once per compiled joint.

    The compiled callable is kept with ``compiled``, keyed by the region's graph
    (its code, which names every node), the layouts of its inputs and the options,
    so ``compiled.repro`` and a second ``bisect`` reuse what was compiled here.

    Args:
        compiled: The :class:`jointlab.CompiledJoint` the region comes from.
        gm: Its joint graph module.
        region: The region.
        values: The uncompiled graph's values (the region's example inputs).
        state: The Inductor state to compile under (:func:`_built_state`).
        options: Extra Inductor options.

    Returns:
        A callable taking the region's inputs positionally.
    """
    mod = region_module(gm, region)
    args = [values[n] for n in region.inputs]
    backend = getattr(compiled, "backend", "inductor")
    extra = {**(_PROVENANCE if backend == "inductor" else {}), **(options or {})}
    key = (backend, mod.code, region.inputs, region.outputs,
           tuple(_layout(a) for a in args), tuple(sorted((k, repr(v)) for k, v in extra.items())))
    cache = _REGIONS.setdefault(compiled, {})
    if key not in cache:
        with _applied(state) as opts:
            cache[key] = compile_region(backend, mod, args, {**opts, **extra})
    return cache[key]


def uncompiled_values(source: Any, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """Every node's value from one run of the uncompiled graph (FX interpreter)."""
    recorder = ValueRecorder(source.graph_module)
    source.run_with(recorder.run, model, inputs)
    return recorder.values


def _refuse_random(gm: fx.GraphModule) -> None:
    for n in gm.graph.nodes:
        if _meta.draws_random(n):  # attention with dropout_p=0 carries the tag, draws nothing
            raise CompiledGraphError(
                f"jl.bisect cannot compare regions of a graph with random ops: node {n.name} "
                f"({n.target}) would draw other numbers when its region runs alone, so a "
                "difference would not mean a bug. Trace the step without dropout or other "
                "random ops (e.g. model.eval() for dropout) and bisect that graph.")


def _check(region: Region, fn: Callable[..., Any], values: dict[str, Any],
           tol: Tolerance, gm: fx.GraphModule) -> list[RegionCheck]:
    args = [v.clone() if isinstance(v, torch.Tensor) else v
            for v in (values[n] for n in region.inputs)]
    with torch.no_grad():
        outs = list(fn(*args))
    checks = []
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, got in zip(region.outputs, outs):
        want = values[name]
        ok = close(got, want, tol) or close(  # relative to the magnitudes that produced it
            got, want, tol, produced_scale(nodes[name], lambda n: values.get(n.name)))
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            abs_err, rel_err, _ = errors(got, want)
        else:
            abs_err = rel_err = 0.0 if ok else float("inf")
        checks.append(RegionCheck(region.index, name, ok, abs_err, rel_err))
    return checks


def _with_kernels(compiled: Any, regions: list[Region]) -> list[Region]:
    try:
        kmap = kernel_map(compiled)
    except CompiledGraphError:  # not Inductor, or the whole graph has not run yet
        return regions
    out = []
    for r in regions:
        names = set(r.nodes)
        ks = tuple(k for k, covered in kmap.items() if names & set(covered))
        out.append(Region(r.index, r.nodes, r.inputs, r.outputs, r.modules, r.phase, ks))
    return out


def bisect(compiled: Any, model: nn.Module, inputs: dict[str, Any], *, regions: int = 6,
           rtol: float | None = None, atol: float | None = None,
           options: dict[str, Any] | None = None) -> Bisection:
    """Find the first region of ``compiled``'s joint graph whose compiled outputs diverge.

    Region by region, not kernel by kernel: see the module docstring.

    Args:
        compiled: A :class:`jointlab.CompiledJoint`.
        model: The live model (its parameters feed the graph; it is not changed).
        inputs: Keyword inputs for the training step.
        regions: How many regions to aim for.
        rtol: Relative tolerance (default: the graph's compute dtype's).
        atol: Absolute tolerance (default: a dtype fraction of each value's largest |value|).
        options: Extra Inductor options for the region compiles.

    Returns:
        A :class:`Bisection`; ``first`` is None when every region matches.

    Raises:
        jointlab.errors.CompiledGraphError: ``compiled`` is not compiled, or has random ops.
    """
    source = getattr(compiled, "source", None)
    if source is None or not hasattr(compiled, "backend"):
        raise CompiledGraphError(
            f"jl.bisect needs a compiled joint graph (joint.compile(...)), got "
            f"{type(compiled).__name__}; for a traced graph use jl.compare, which names "
            "its first diverging node.")
    gm = source.graph_module
    _refuse_random(gm)
    state, notes = _built_state(compiled, model, inputs)
    values = uncompiled_values(source, model, inputs)
    tol = Tolerance(rtol, atol, False, compute_dtype(source))
    parts = _with_kernels(compiled, split_regions(gm, regions))
    checks: list[RegionCheck] = []
    first = None
    _LAST_SPLIT[compiled] = (regions, dict(options or {}))
    for region in parts:
        fn = region_compiled(compiled, gm, region, values, state, options)
        found = _check(region, fn, values, tol, gm)
        checks.extend(found)
        if first is None and not all(c.ok for c in found):
            first = region
    return Bisection(tuple(parts), tuple(checks), first, notes=tuple(notes))


def first_region(compiled: Any, values: dict[str, Any], tol: Tolerance, state: Any
                 ) -> tuple[Region | None, Callable[..., Any] | None, list[str]]:
    """The first diverging region, split and compiled as the last :func:`bisect` of ``compiled``.

    Regions that bisect (or an earlier call) compiled are not compiled again, and
    the walk stops at the first region that diverges.

    Args:
        compiled: A :class:`jointlab.CompiledJoint`.
        values: The uncompiled graph's values.
        tol: How values are judged.
        state: The Inductor state ``compiled`` was built with.

    Returns:
        ``(region, its compiled callable, its diverging outputs)``; ``(None, None, [])``
        when no region diverges.
    """
    gm = compiled.source.graph_module
    _refuse_random(gm)
    k, options = _LAST_SPLIT.get(compiled, (6, {}))
    for region in _with_kernels(compiled, split_regions(gm, k)):
        fn = region_compiled(compiled, gm, region, values, state, options)
        bad = [c.node for c in _check(region, fn, values, tol, gm) if not c.ok]
        if bad:
            return region, fn, bad
    return None, None, []


def _built_state(compiled: Any, model: nn.Module, inputs: dict[str, Any]
                 ) -> tuple[Any, list[str]]:
    """The Inductor state ``compiled`` was built with, and notes on how it differs from now.

    A compiled graph that has not run yet is compiled now (one run on a copy of
    the model), so what is bisected is the code it will run.
    """
    if not hasattr(compiled, "compiler_state"):
        return None, []
    if compiled.compiler_state is None:
        compiled.run(copy.deepcopy(model), inputs)
    state = compiled.compiler_state
    changed = torch_compat.state_changes(state) if state is not None else []
    if not changed:
        return state, []
    shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    return state, [f"Inductor's state changed since this graph was compiled ({shown}): regions "
                   "were compiled under the state that built it, so they check the code you "
                   "hold, not what a fresh compile would produce now"]


def _applied(state: Any) -> Any:
    return contextlib.nullcontext({}) if state is None else \
        torch_compat.inductor_state_applied(state)
