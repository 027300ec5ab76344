"""``compiled.repro()``: how big the written repro is, and what it costs after compare / bisect.

Wrong Inductor lowerings and a wrong decomposition are patched in for one compile each
(forward ``relu`` lowered as ``abs``; backward-only ``le`` lowered as ``lt``, the mask of
relu's backward; ``gelu``'s decomposition scaled by 1.01) and undone. For each: the
repro's region (nodes, and the kernel, op or bisect region it was cut for), its file's
lines, and the seconds of ``c.repro`` right after ``c.compare``, of a second ``c.repro``,
and (compiled regions forgotten) of ``c.repro`` right after ``jl.bisect``. Every compile
runs on one thread with Inductor's caches off (as bisect and repro compile). Run alone:
``python bench/bench_repro.py``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import torch
from run import row

aten = torch.ops.aten


@contextlib.contextmanager
def _wrong(kind: str):
    from jointlab import torch_compat

    if kind == "gelu decomposition":
        table = torch_compat.torch_module("torch._inductor.decomposition", "inject a bug")
        table, op = table.decompositions, aten.gelu.default
        orig = table[op]
        table[op] = lambda x, approximate="none": orig(x, approximate) * 1.01
    else:
        lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a bug")
        table = lowering.lowerings
        if kind == "relu lowering (forward)":
            op = aten.relu.default
            orig, table[op] = table[op], table[aten.abs.default]
        else:  # relu's backward reads le(out, 0): lt lets the gradient through at zeros
            op = aten.le.Scalar
            orig, table[op] = table[op], table[aten.lt.Scalar]
    try:
        yield
    finally:
        table[op] = orig


CASES = [("cnn_bn", "relu lowering (forward)"), ("cnn_bn", "le lowering (backward only)"),
         ("mlp", "relu lowering (forward)"), ("mlp", "gelu decomposition")]


def _case(name: str, kind: str) -> dict:
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    with _wrong(kind):
        bad = joint.compile("inductor")
        bad.run(model, inputs)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cmp = bad.compare(model, inputs)
        out["compare"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = bad.repro(f"{tmp}/a.py", model, inputs, comparison=cmp)
        out["repro after compare"] = time.perf_counter() - t0
        text = r.path.read_text()
        out["lines"] = len(text.splitlines())
        reference = text.split("def forward(", 1)[1].split("\n\n", 1)[0]
        out["fx lines"] = len(reference.splitlines())
        t0 = time.perf_counter()
        bad.repro(f"{tmp}/b.py", model, inputs, comparison=cmp)
        out["repro again"] = time.perf_counter() - t0
        _forget_compiled_regions(bad)  # as in a session that ran bisect, not repro, first
        t0 = time.perf_counter()
        jl.bisect(bad, model, inputs)
        out["bisect"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bad.repro(f"{tmp}/c.py", model, inputs, comparison=cmp)
        out["repro after bisect"] = time.perf_counter() - t0
    out["nodes"] = len(r.region)
    out["cut for"] = getattr(r, "cut", None) or (r.kernel or "bisect region")
    return out


def _forget_compiled_regions(compiled) -> None:
    from jointlab.analysis import bisect

    cache = getattr(bisect, "_REGIONS", None)  # absent before regions were kept
    if cache is not None:
        cache.pop(compiled, None)


def rows(ctx):
    """One row per injected bug: repro seconds after compare, with size and the rest."""
    from tests.util import one_thread

    out = []
    for name, kind in CASES:
        with one_thread():
            m = _case(name, kind)
        detail = (f"{m['nodes']} nodes, {m['lines']} lines ({m['fx lines']} in the ATen "
                  f"reference), cut for {m['cut for']}; compare {m['compare']:.1f} s, repro "
                  f"again {m['repro again']:.1f} s, bisect {m['bisect']:.1f} s, repro after "
                  f"bisect {m['repro after bisect']:.1f} s")
        out.append(row(f"{name}, {kind}: c.repro after c.compare", m["repro after compare"],
                       "s", "", None, detail=detail))
        if ctx is None:  # run alone: each row as it is measured
            print(f"{out[-1]['name']}: {out[-1]['value']:.1f} s; {detail}", flush=True)
    return out


if __name__ == "__main__":
    rows(None)
