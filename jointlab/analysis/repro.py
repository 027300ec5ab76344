"""``compiled.repro(path, ...)``: one self-contained Python file that reproduces a divergence.

When a compiled step differs from the uncompiled graph, a compiler bug report
needs a standalone reproduction. :func:`write_repro` cuts out the smallest
region that still diverges on its own, compiled alone under the Inductor state
that built ``compiled``, trying in order:

1. ``kernel``: the nodes of the first diverging kernel
   (:mod:`jointlab.analysis.kernel_probe`), with the ``getitem`` nodes of their
   tuple-valued ops (``native_batch_norm``, ``nll_loss_forward``,
   ``split_with_sizes``) so the region returns tensors;
2. ``op``: where no kernel diverged (the bug arose in a decomposition), the
   traced op whose decomposed value differs;
3. ``bisect region``: the first diverging region of :func:`jointlab.analysis.bisect.bisect`,
   split as the last ``bisect`` of ``compiled`` split it, reusing the regions it
   compiled (no region is compiled twice for one compiled joint).

The result's ``cut`` says which, and ``note`` why an earlier one was not used.
It then writes:

- ``path``: a Python file needing only torch. It holds the region's ATen graph
  as Python (the eager reference, each op under a comment naming the user's
  module and source line), the code Inductor generated for the region in a
  block of its own (a raw multi-line string, or ``path`` with suffix
  ``.inductor.py`` beside it where the code cannot be quoted), so a bug patched
  into a lowering is reproduced in a fresh process (``--recompile`` compiles
  the graph with the torch at hand instead), and the assertion on the outputs
  jointlab judged diverging, with the tolerances it used. It exits 1 when they
  diverge.
- ``path`` with suffix ``.pt``: the region's input values, read with
  ``torch.load(..., weights_only=True)``.

Outputs that jointlab judged within tolerance only relative to the
magnitudes that produced them (rounding noise of a sum that cancels) are not
asserted: the file checks what was found wrong, nothing else.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from jointlab import meta as _meta
from jointlab.analysis.bisect import (
    Region,
    _built_state,
    _check,
    first_region,
    region_compiled,
    region_module,
    uncompiled_values,
)
from jointlab.analysis.compare.judge import Tolerance, compute_dtype
from jointlab.analysis.kernels import kernel_map
from jointlab.errors import ReproError
from jointlab.passes.analyze import is_getitem
from jointlab.torch_compat import inductor_provenance

__all__ = ["Repro", "write_repro"]


@dataclass(frozen=True)
class Repro:
    """What :func:`write_repro` wrote.

    Attributes:
        path: The Python file; ``inputs``: the ``.pt`` file beside it.
        region: The region's node names; ``kernel``: the kernel it was cut for (or "").
        diverging: The region outputs the file asserts on.
        modules: The user's modules of its nodes; ``sources``: their source lines.
        cut: What the region is: ``"kernel"`` (the first diverging kernel's nodes),
            ``"op"`` (the traced op a decomposition broke) or ``"bisect region"``.
        note: Why a smaller cut was not used ("" when the first one was).
        generated: The file holding Inductor's generated code (``path`` itself, or
            the ``.inductor.py`` file beside it).
    """

    path: pathlib.Path
    inputs: pathlib.Path
    region: tuple[str, ...]
    kernel: str
    diverging: tuple[str, ...]
    modules: tuple[str, ...]
    sources: tuple[str, ...]
    cut: str = ""
    note: str = ""
    generated: pathlib.Path | None = None


def _is_multi(node: fx.Node) -> bool:
    """A tuple- or list-valued node (its results are read through ``getitem``)."""
    return isinstance(node.meta.get("val"), (tuple, list)) or (
        bool(node.users) and all(is_getitem(u) for u in node.users))


def kernel_region(gm: fx.GraphModule, names: list[str]) -> Region | None:
    """The region of ``gm`` made of ``names`` (a kernel's nodes); None if it has no call.

    A tuple-valued op of ``names`` brings its ``getitem`` nodes in (the region
    returns tensors, never a tuple); a ``getitem`` whose op is outside is read as
    an input instead.
    """
    wanted = set(names)
    group = [n for n in gm.graph.nodes if n.op == "call_function" and (
        n.name in wanted or (is_getitem(n) and n.args[0].name in wanted))]
    group = [n for n in group if not (is_getitem(n) and n.args[0].name not in wanted)]
    if not any(not is_getitem(n) for n in group):
        return None
    inside = set(group)
    ins = dict.fromkeys(a.name for n in group for a in n.all_input_nodes if a not in inside)
    values = [n for n in group if not _is_multi(n)]
    outs = [n.name for n in values if any(u not in inside for u in n.users)]
    if not outs and values:
        outs = [values[-1].name]
    modules = dict.fromkeys(_meta.module(n) for n in group)
    phases = dict.fromkeys(_meta.phase(n) or "?" for n in group)
    return Region(0, tuple(n.name for n in group), tuple(ins), tuple(outs), tuple(modules),
                  "+".join(phases))


def _candidates(comparison: Any) -> list[tuple[str, str, list[str]]]:
    """``(cut, label, node names)`` to try before bisect: the first kernel, the decomposed op."""
    out = []
    for check in (getattr(comparison, "kernels", None) or {}).values():
        first = getattr(check, "first", None)
        if first is not None:
            out.append(("kernel", first.kernel, list(first.nodes)))
        decomposed = getattr(check, "decomposed", None)
        if decomposed is not None:
            out.append(("op", decomposed.node, [decomposed.node]))
        if out:
            break
    return out


def _diverging(compiled: Any, region: Region, values: dict[str, Any], tol: Tolerance,
               state: Any) -> tuple[Any, list[str], str]:
    """Compile ``region`` alone; its compiled callable, the outputs beyond tolerance, or why not."""
    gm = compiled.source.graph_module
    mod = region_module(gm, region)
    args = [values[n] for n in region.inputs]
    if not all(isinstance(a, torch.Tensor) for a in args):
        return None, [], "it reads a value that is not a tensor"
    if mod.graph.find_nodes(op="get_attr"):
        return None, [], "it reads a constant baked into the graph"
    if any(_meta.draws_random(n) for n in mod.graph.nodes):
        return None, [], "it draws random numbers"
    try:
        fn = region_compiled(compiled, gm, region, values, state)
        checks = _check(region, fn, values, tol, gm)
    except Exception as exc:  # noqa: BLE001 - a region Inductor cannot compile alone
        return None, [], f"Inductor could not compile it alone ({type(exc).__name__})"
    bad = [c.node for c in checks if not c.ok]
    return fn, bad, "" if bad else ("it does not diverge when compiled alone (Inductor "
                                    "fuses it differently there)")


def _smallest(compiled: Any, model: nn.Module, inputs: dict[str, Any], comparison: Any,
              tol: Tolerance) -> tuple[Region, str, str, Any, list[str], dict[str, Any], str]:
    """The smallest diverging region: ``(region, cut, label, fn, bad, values, note)``."""
    state, _ = _built_state(compiled, model, inputs)
    values = uncompiled_values(compiled.source, model, inputs)
    gm = compiled.source.graph_module
    notes = []
    for cut, label, names in _candidates(comparison):
        region = kernel_region(gm, names)
        if region is None:
            notes.append(f"{cut} {label}: covers no call")
            continue
        fn, bad, why = _diverging(compiled, region, values, tol, state)
        if bad:
            return region, cut, label, fn, bad, values, "; ".join(notes)
        notes.append(f"{cut} {label} ({len(region.nodes)} nodes): {why}")
    found, fn, bad = first_region(compiled, values, tol, state)
    if found is None:
        raise ReproError(
            "compare found a divergence, but neither the first diverging kernel's nodes nor "
            "any bisect region diverges when compiled alone (Inductor fuses differently "
            "there): no standalone region reproduces it."
            + (f" Tried: {'; '.join(notes)}." if notes else ""))
    return found, "bisect region", "", fn, bad, values, "; ".join(notes)


_TEMPLATE = """\"\"\"Standalone reproduction of a compiled-code divergence (jointlab repro()).

{header}
Run: python {name}    (exits 1 when the compiled region diverges from its ATen reference)
     python {name} --recompile    (compile the region with the torch at hand instead of
                                   running the code Inductor generated when it diverged)
Needs only torch; the inputs are in {inputs} (torch.load(..., weights_only=True)).
\"\"\"
import math
import operator  # noqa: F401
import pathlib
import sys

import torch
from torch import device  # noqa: F401

inf, nan = math.inf, math.nan
INPUTS = pathlib.Path(__file__).with_name({inputs!r})
OUTPUTS = {outputs!r}
# output index -> (name, rtol, atol): the outputs jointlab judged diverging, its tolerances
ASSERTED = {asserted!r}


# ---- the eager reference: the region's ATen ops, run one by one ----------------------
# (above each op: the user's module, its type, the source line and the phase)
{graph}


# ---- the code Inductor generated for the region ---------------------------------------
{generated}
# ---- end of the generated code ---------------------------------------------------------


def compiled_region(args):
    if "--recompile" in sys.argv:
        fn = torch.compile(lambda *a: forward(None, *a), backend="inductor",
                           options={{"fallback_random": True}})
        return list(fn(*args))
    namespace = {{"__name__": "jointlab_repro_generated"}}
    exec(compile(GENERATED, "<inductor generated code>", "exec"), namespace)
    return list(namespace["call"](list(args)))


def main():
    args = torch.load(INPUTS, weights_only=True)
    with torch.no_grad():
        want = forward(None, *[a.clone() for a in args])
        got = compiled_region([a.clone() for a in args])
    bad = 0
    for i, (name, rtol, atol) in ASSERTED.items():
        err = (got[i].double() - want[i].double()).abs().max().item()
        ok = torch.isclose(got[i], want[i], rtol=rtol, atol=atol, equal_nan=True).all().item()
        print(f"{{name}}: max abs err {{err:.3g}} (rtol {{rtol:.2g}}, atol {{atol:.2g}}):",
              "ok" if ok else "DIVERGES")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
"""

_QUOTE = '"' * 3


def _generated_block(code: str, path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """The ``GENERATED = ...`` block: a raw multi-line string, or a file beside ``path``."""
    if _QUOTE not in code and "\r" not in code:
        return f"GENERATED = r{_QUOTE}\n{code.rstrip()}\n{_QUOTE}", path
    side = path.with_suffix(".inductor.py")  # cannot be quoted raw: kept in a file of its own
    side.write_text(code, encoding="utf-8")
    return (f"# in {side.name} beside this file (it cannot be quoted here)\n"
            f"GENERATED = pathlib.Path(__file__).with_name({side.name!r}).read_text()"), side


def _op_comment(node: fx.Node) -> str:
    info = _meta.info(node)
    module = _meta.module_label(info.get("module") or "")
    kind = f" ({info['module_type']})" if info.get("module_type") else ""
    parts = [f"{module}{kind}", info.get("source") or "source unknown", info.get("phase", "")]
    return "# " + " · ".join(p for p in parts if p)


def annotated_code(mod: fx.GraphModule, gm: fx.GraphModule) -> str:
    """``mod``'s Python with, above each op, its module, type, source line and phase in ``gm``.

    Args:
        mod: A region's graph module (:func:`jointlab.analysis.bisect.region_module`).
        gm: The joint graph it was cut from (whose nodes carry jointlab's annotations).

    Returns:
        The code, one comment line before each op that is not a ``getitem``.
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    out = []
    for line in mod.code.strip().splitlines():
        head = line.split(" = ", 1)[0]
        node = by_name.get(head.strip()) if head.startswith("    ") else None
        if node is not None and node.op == "call_function" and not is_getitem(node):
            out.append(f"    {_op_comment(node)}")
        out.append(line)
    return "\n".join(out)


def _header(compiled: Any, region: Region, cut: str, label: str, note: str
            ) -> tuple[str, tuple[str, ...]]:
    by_name = {n.name: n for n in compiled.source.graph.nodes}
    sources = tuple(dict.fromkeys(s for n in region.nodes
                                  if (s := _meta.info(by_name[n]).get("source"))))
    items = sum(is_getitem(by_name[n]) for n in region.nodes)
    what = {"kernel": f"the nodes of kernel {label}",
            "op": f"the op {label}, which a decomposition broke (every kernel matched the "
                  "graph Inductor lowered)",
            }.get(cut, f"bisect region {region.index}")
    size = f"{len(region.nodes)} nodes" + (f", {items} of them getitem" if items else "")
    lines = [f"Region: {what} ({size}, {region.phase}).",
             f"Modules: {', '.join(map(_meta.module_label, region.modules))}",
             *[f"Source: {s}" for s in sources[:8]]]
    if note:
        lines.append(f"Not smaller because: {note}")
    return "\n".join(lines), sources


def write_repro(compiled: Any, model: nn.Module, inputs: dict[str, Any],
                path: str | pathlib.Path, comparison: Any) -> Repro:
    """Write the smallest diverging region of ``compiled`` as a standalone Python file.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``, static shapes).
        model: The live model (not changed).
        inputs: Keyword inputs for the training step.
        path: The Python file to write; the inputs go beside it with suffix ``.pt``.
        comparison: ``compiled.compare(model, inputs)``'s result.

    Returns:
        A :class:`Repro`; ``cut`` says whether it holds a kernel, an op or a bisect region.

    Raises:
        jointlab.errors.ReproError: The comparison found nothing to reproduce, or no
            region diverges when compiled alone.
        jointlab.errors.CompiledGraphError: Not an Inductor compile; or bisect was needed
            and the graph draws random numbers.
    """
    if comparison.ok:
        raise ReproError(f"nothing to reproduce: the comparison's verdict is "
                         f"{comparison.verdict!r}; repro() writes a divergence, and there is none.")
    kernel_map(compiled)  # refuses a compile without Inductor's kernel map
    tol = Tolerance(None, None, False, compute_dtype(compiled.source))
    region, cut, label, fn, bad, values, note = _smallest(compiled, model, inputs,
                                                           comparison, tol)
    path = pathlib.Path(path)
    pt = path.with_suffix(".pt")
    torch.save([values[n].detach().clone() for n in region.inputs], pt)
    gm = compiled.source.graph_module
    kernel = label if cut == "kernel" else ""
    header, sources = _header(compiled, region, cut, label, note)
    asserted = {i: (n, *tol.bounds(values[n])) for i, n in enumerate(region.outputs) if n in bad}
    generated, side = _generated_block(inductor_provenance(fn)[1], path)
    path.write_text(_TEMPLATE.format(
        header=header, name=path.name, inputs=pt.name, outputs=list(region.outputs),
        asserted=asserted, graph=annotated_code(region_module(gm, region), gm),
        generated=generated))
    return Repro(path, pt, region.nodes, kernel, tuple(bad), region.modules, sources, cut,
                 note, side)
