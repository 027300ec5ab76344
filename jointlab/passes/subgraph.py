"""A contiguous run of a joint graph's nodes as a graph module of its own.

``jl.bisect`` and ``compiled.repro`` (:mod:`jointlab.analysis.bisect`,
:mod:`jointlab.analysis.repro`) compile and run one region of a joint graph
at a time. :func:`subgraph_module` builds that region's graph: a placeholder
per value the region reads from outside, a copy of each of its nodes, and an
output of the values read after it. The source graph is only read.

Meta keys written (on the new graph's nodes only): each placeholder gets a
copy of the meta of the node whose value it stands for (``val``,
``meta["jointlab"]``...); each copied node keeps its source's meta (as
``fx.Graph.node_copy`` copies it).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import fx

__all__ = ["subgraph_module"]


def subgraph_module(gm: fx.GraphModule, inputs: Sequence[str], nodes: Sequence[str],
                    outputs: Sequence[str]) -> fx.GraphModule:
    """A graph module computing the nodes named ``outputs`` from those named ``inputs``.

    Args:
        gm: The joint graph (only read).
        inputs: Names of the nodes whose values the region reads from outside.
        nodes: Names of the region's nodes, in graph order.
        outputs: Names of the region's nodes read after it, returned as a tuple.

    Returns:
        The region's graph module (its attributes are looked up on ``gm``).
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for name in inputs:
        env[by_name[name]] = g.placeholder(name)
        env[by_name[name]].meta = dict(by_name[name].meta)
    for name in nodes:
        env[by_name[name]] = g.node_copy(by_name[name], lambda a: env[a])
    g.output(tuple(env[by_name[n]] for n in outputs))
    return fx.GraphModule(gm, g)
