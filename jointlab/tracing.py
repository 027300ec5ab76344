"""``jl.trace`` and ``jl.trace_ranks``: the tracer's plain graphs, handed over as JointGraphs.

:mod:`jointlab.trace` builds a :class:`~jointlab.runtime.graph.RunnableGraph`
and never imports the facade; these two public entry points, at the top of
the package, wrap what it returns with :meth:`jointlab.graph.JointGraph.of`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from jointlab.graph import JointGraph
from jointlab.runtime.graph import RunnableGraph
from jointlab.runtime.rank_view import RankGraphs
from jointlab.trace import rank_classes, tracer

__all__ = ["trace", "trace_ranks"]


def _returns_joint(fn: Callable[..., RunnableGraph]) -> Callable[..., JointGraph]:
    @functools.wraps(fn)
    def public(*args: Any, **kwargs: Any) -> JointGraph:
        return JointGraph.of(fn(*args, **kwargs))

    public.__annotations__ = {**fn.__annotations__, "return": "JointGraph"}
    return public


#: ``jl.trace``: :func:`jointlab.trace.tracer.trace`, returning a :class:`JointGraph`.
trace = _returns_joint(tracer.trace)


@functools.wraps(rank_classes.trace_ranks)
def trace_ranks(model: nn.Module, train_fn: Callable[..., Any], inputs: dict[str, Any],
                **kwargs: Any) -> RankGraphs:
    ranks = rank_classes.trace_ranks(model, train_fn, inputs, **kwargs)
    return dataclasses.replace(ranks, graphs={c: JointGraph.of(g)
                                              for c, g in ranks.graphs.items()})
