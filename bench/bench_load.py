"""Load cost: ``jl.load`` of an archive as a share of tracing the same graph.

The subject is a real trace of the GPT-2-shaped LM of :mod:`jointlab.models`,
narrow so it traces quickly on a small machine, at 16 and 40 layers (about 2k
and 5k nodes). Load cost per node is flat while tracing grows faster, so the
ratio falls with size; the issue's target is about a 50k-node graph, so it is
checked at the larger size and the smaller one is reported beside it.
Both are timed alternately in one run, each by its least disturbed sample (the
machine is shared); the target is a load at most 5% of the trace. The load
covers the whole of ``jl.load``: reading and checking the archive, building
the graph, and rebuilding every node's fake ``meta["val"]``. The graph's Python
code is generated when first run or read (:mod:`jointlab.io.deferred`); the
row "load + code" times that too, for reference.

With ``JOINTLAB_BENCH_LOAD_BIG=1`` the issue's own size is measured as well:
385 layers, about 50k nodes. Its trace takes over a minute, so it is traced
once (that trace is its sample; nothing at this size is warm-up dominated),
saved, and loaded three times (the least disturbed load counts).
"""

from __future__ import annotations

import gc
import os
import pathlib
import tempfile
import time

from run import interleaved, narrow_lm, row

import jointlab as jl

SIZES = (16, 40)
BIG = 385  # about 50k nodes: the graph of the issue
TARGET = 0.05


def rows(ctx):
    out = []
    for n_layer in SIZES[:1] if ctx.quick else SIZES:
        out += _rows_at(ctx, n_layer, checked=n_layer == SIZES[-1])
    if os.environ.get("JOINTLAB_BENCH_LOAD_BIG") == "1":
        out += _big_rows()
    return out


def _big_rows():
    model, train_fn, inputs = narrow_lm(BIG)
    t0 = time.perf_counter()
    joint = jl.trace(model, train_fn, inputs)
    trace_s = time.perf_counter() - t0
    n = len(joint.graph.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(pathlib.Path(tmp) / "lm.jlg")
        joint.save(path)
        del joint
        load_s = min(_timed(lambda: jl.load(path)) for _ in range(3))
    ratio = load_s / trace_s
    name = f"gpt2-{BIG}L d16"
    return [
        row(f"{name}: jl.trace (one sample)", trace_s, "s", detail=f"{n} nodes"),
        row(f"{name}: jl.load", load_s, "s"),
        row(f"{name}: jl.load / jl.trace", ratio, "x", f"<= {TARGET}", ratio <= TARGET),
    ]


def _timed(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rows_at(ctx, n_layer: int, checked: bool):
    model, train_fn, inputs = narrow_lm(n_layer)
    joint = jl.trace(model, train_fn, inputs)
    n = len(joint.graph.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(pathlib.Path(tmp) / "lm.jlg")
        joint.save(path)
        size = pathlib.Path(path).stat().st_size
        t = interleaved({"trace": lambda: jl.trace(model, train_fn, inputs),
                         "load": lambda: jl.load(path),
                         "load + code": lambda: jl.load(path).graph_module.code},
                        repeat=2 if ctx.quick else 3, stat=min)
    ratio = t["load"] / t["trace"]
    name = f"gpt2-{n_layer}L d16"
    return [
        row(f"{name}: jl.trace", t["trace"], "s", detail=f"{n} nodes"),
        row(f"{name}: jl.load", t["load"], "s", detail=f"{size} bytes archive"),
        row(f"{name}: jl.load / jl.trace", ratio, "x", f"<= {TARGET}" if checked else "",
            ratio <= TARGET if checked else None),
        row(f"{name}: (jl.load + code generation) / jl.trace", t["load + code"] / t["trace"], "x"),
    ]
