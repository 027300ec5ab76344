"""Load cost: ``jl.load`` of an archive as a share of tracing the same graph.

The subject is a real trace of the GPT-2-shaped LM of :mod:`jointlab.models`
(16 layers, narrow so it traces quickly on a small machine; about 2k nodes).
Both are timed alternately in one run; the target is a load at most 5% of
the trace. The load covers the whole of ``jl.load``: reading and checking the
archive, building and compiling the graph, and rebuilding every node's fake
``meta["val"]``.
"""

from __future__ import annotations

import pathlib
import tempfile

from run import interleaved, row

import jointlab as jl
from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

N_LAYER = 16
TARGET = 0.05


def rows(ctx):
    model = make_gpt2(n_layer=N_LAYER, d=16, n_head=2, vocab=32, seq=8)
    inputs = lm_inputs(1, 32, 8)
    joint = jl.trace(model, lm_train_fn, inputs)
    n = len(joint.graph.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(pathlib.Path(tmp) / "lm.jlg")
        joint.save(path)
        size = pathlib.Path(path).stat().st_size
        t = interleaved({"trace": lambda: jl.trace(model, lm_train_fn, inputs),
                         "load": lambda: jl.load(path)}, repeat=2 if ctx.quick else 3)
    ratio = t["load"] / t["trace"]
    name = f"gpt2-{N_LAYER}L d16"
    return [
        row(f"{name}: jl.trace", t["trace"], "s", detail=f"{n} nodes"),
        row(f"{name}: jl.load", t["load"], "s", detail=f"{size} bytes archive"),
        row(f"{name}: jl.load / jl.trace", ratio, "x", f"<= {TARGET}", ratio <= TARGET),
    ]
