"""Node-table cost: share of trace time, and linear scaling with node count.

Every build is uncached: the analysis stamp is cleared first, so each timing
covers ``ensure_analyzed`` (category, FLOPs, storage) plus the DataFrame build.
Scaling uses two real traces of the GPT-2-shaped model with a small width
(d=16, seq=8) and the layer count chosen to reach about 5k and 50k nodes; no
graph is made by concatenating copies.
"""

from __future__ import annotations

from run import interleaved, narrow_lm, row, timeit

import jointlab as jl
from jointlab.analysis.tables import node_table
from jointlab.passes.analyze import ensure_analyzed, forget_analysis

# About 130 nodes per layer at this width: 38 layers ~ 5k nodes, 384 ~ 50k.
SMALL_LAYERS, LARGE_LAYERS = 38, 384


def uncached_build(joint) -> None:
    """Analysis and table from scratch (the analysis now runs in ``jl.trace``)."""
    forget_analysis(joint.graph_module)
    ensure_analyzed(joint.graph_module)
    node_table(joint)


def narrow_gpt2(n_layer: int):
    """A real trace of a narrow GPT-2-shaped model with ``n_layer`` layers."""
    return jl.trace(*narrow_lm(n_layer))


def rows(ctx):
    joint = ctx.gpt2_joint
    n = len(joint.graph.nodes)
    build = timeit(lambda: uncached_build(joint), repeat=3 if ctx.quick else 7)
    share = build / ctx.gpt2_trace_s
    out = [
        row("gpt2-12L d256: node table build (uncached)", build, "s", detail=f"{n} nodes"),
        row("gpt2-12L d256: node table / jl.trace", share, "x", "<= 0.10", share <= 0.10),
    ]
    small, large = narrow_gpt2(SMALL_LAYERS), narrow_gpt2(LARGE_LAYERS)
    ns, nl = len(small.graph.nodes), len(large.graph.nodes)
    t = interleaved({"small": lambda: uncached_build(small),
                     "large": lambda: uncached_build(large)}, repeat=3 if ctx.quick else 5)
    per_s, per_l = t["small"] / ns, t["large"] / nl
    ratio = per_l / per_s
    out += [
        row(f"node table per node, {ns} nodes (real trace)", per_s * 1e6, "us"),
        row(f"node table per node, {nl} nodes (real trace)", per_l * 1e6, "us"),
        row("node table per-node time, 50k / 5k", ratio, "x", "<= 1.3", ratio <= 1.3),
    ]
    return out
