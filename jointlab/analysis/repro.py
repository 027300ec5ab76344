"""``compiled.repro(path, ...)``: one self-contained Python file that reproduces a divergence.

When a compiled step differs from the uncompiled graph, a compiler bug report
needs a standalone reproduction. :func:`write_repro` cuts out the smallest
region that still diverges on its own: first the nodes of the first
diverging kernel (:mod:`jointlab.analysis.kernel_probe`), compiled alone under
the Inductor state that built ``compiled``; if that region does not diverge
alone (Inductor fuses differently there), the first diverging region
:func:`jointlab.analysis.bisect.bisect` finds. It then writes:

- ``path``: a Python file needing only torch. It holds the region's ATen graph
  as Python (the eager reference: the region's ATen ops run one by one, with
  the user's module and source line in comments), the code Inductor generated
  for the region (the diverging code itself, so a bug patched into a lowering
  is reproduced in a fresh process; ``--recompile`` compiles the graph with
  the torch at hand instead), and the assertion on the outputs jointlab judged
  diverging, with the tolerances it used. It exits 1 when they diverge.
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
    _applied,
    _built_state,
    _check,
    bisect,
    compile_region,
    region_module,
    uncompiled_values,
)
from jointlab.analysis.compare.judge import Tolerance, compute_dtype
from jointlab.analysis.kernels import kernel_map
from jointlab.errors import ReproError
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
    """

    path: pathlib.Path
    inputs: pathlib.Path
    region: tuple[str, ...]
    kernel: str
    diverging: tuple[str, ...]
    modules: tuple[str, ...]
    sources: tuple[str, ...]


def kernel_region(gm: fx.GraphModule, names: list[str]) -> Region | None:
    """The region of ``gm`` made of ``names`` (a kernel's nodes); None if it has no call."""
    wanted = set(names)
    group = [n for n in gm.graph.nodes if n.name in wanted and n.op == "call_function"]
    if not group:
        return None
    inside = set(group)
    ins = dict.fromkeys(a.name for n in group for a in n.all_input_nodes if a not in inside)
    outs = [n.name for n in group if any(u not in inside for u in n.users)] or [group[-1].name]
    modules = dict.fromkeys(_meta.module(n) for n in group)
    phases = dict.fromkeys(_meta.phase(n) or "?" for n in group)
    return Region(0, tuple(n.name for n in group), tuple(ins), tuple(outs), tuple(modules),
                  "+".join(phases))


def _first_kernel_nodes(comparison: Any) -> tuple[str, list[str]]:
    for check in (getattr(comparison, "kernels", None) or {}).values():
        first = getattr(check, "first", None)
        if first is not None:
            return first.kernel, list(first.nodes)
    return "", []


def _diverging(compiled: Any, region: Region, values: dict[str, Any], tol: Tolerance,
               state: Any) -> tuple[Any, list[str]]:
    """Compile ``region`` alone; its compiled callable and the outputs beyond tolerance."""
    gm = compiled.source.graph_module
    mod = region_module(gm, region)
    args = [values[n] for n in region.inputs]
    if (not all(isinstance(a, torch.Tensor) for a in args) or mod.graph.find_nodes(op="get_attr")
            or any(_meta.draws_random(n) for n in mod.graph.nodes)):
        return None, []  # tuples, constants or random draws do not stand alone in a file
    try:
        with _applied(state) as opts:
            fn = compile_region("inductor", mod, args,
                                {**opts, "trace.provenance_tracking_level": 1})
        checks = _check(region, fn, values, tol, gm)
    except Exception:  # noqa: BLE001 - a region Inductor cannot compile alone: try bisect's
        return None, []
    return fn, [c.node for c in checks if not c.ok]


def _smallest(compiled: Any, model: nn.Module, inputs: dict[str, Any], comparison: Any,
              tol: Tolerance) -> tuple[Region, str, Any, list[str], dict[str, Any]]:
    state, _ = _built_state(compiled, model, inputs)
    values = uncompiled_values(compiled.source, model, inputs)
    kernel, names = _first_kernel_nodes(comparison)
    region = kernel_region(compiled.source.graph_module, names) if names else None
    if region is not None:
        fn, bad = _diverging(compiled, region, values, tol, state)
        if bad:
            return region, kernel, fn, bad, values
    found = bisect(compiled, model, inputs, rtol=tol.rtol, atol=tol.atol).first
    if found is None:
        raise ReproError(
            "compare found a divergence, but neither the first diverging kernel's nodes nor "
            "any bisect region diverges when compiled alone (Inductor fuses differently "
            "there): no standalone region reproduces it.")
    fn, bad = _diverging(compiled, found, values, tol, state)
    if not bad:
        raise ReproError(f"bisect's region {found.index} diverged but not when recompiled for "
                         "the repro; no standalone region reproduces it.")
    return found, "", fn, bad, values


_TEMPLATE = '''"""Standalone reproduction of a compiled-code divergence (jointlab repro()).

{header}
Run: python {name}    (exits 1 when the compiled region diverges from its ATen reference)
     python {name} --recompile    (compile the region with the torch at hand instead of
                                   running the code Inductor generated when it diverged)
Needs only torch; the inputs are in {inputs} (torch.load(..., weights_only=True)).
"""
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
{graph}

# ---- the code Inductor generated for the region --------------------------------------
GENERATED = {generated!r}


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
'''


def _header(compiled: Any, region: Region, kernel: str) -> tuple[str, tuple[str, ...]]:
    by_name = {n.name: n for n in compiled.source.graph.nodes}
    sources = tuple(dict.fromkeys(s for n in region.nodes
                                  if (s := _meta.info(by_name[n]).get("source"))))
    what = f"kernel {kernel}" if kernel else f"bisect region {region.index}"
    lines = [f"Region: the nodes of {what} ({len(region.nodes)} nodes, {region.phase}).",
             f"Modules: {', '.join(m or '(root)' for m in region.modules)}",
             *[f"Source: {s}" for s in sources[:8]]]
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
        A :class:`Repro`.

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
    region, kernel, fn, bad, values = _smallest(compiled, model, inputs, comparison, tol)
    path = pathlib.Path(path)
    pt = path.with_suffix(".pt")
    torch.save([values[n].detach().clone() for n in region.inputs], pt)
    mod = region_module(compiled.source.graph_module, region)
    header, sources = _header(compiled, region, kernel)
    asserted = {i: (n, *tol.bounds(values[n])) for i, n in enumerate(region.outputs) if n in bad}
    path.write_text(_TEMPLATE.format(
        header=header, name=path.name, inputs=pt.name, outputs=list(region.outputs),
        asserted=asserted, graph=mod.code.strip(), generated=inductor_provenance(fn)[1]))
    return Repro(path, pt, region.nodes, kernel, tuple(bad), region.modules, sources)
