"""Every rank side by side: one row per rank of a :class:`RankGraphs`.

``jl.trace_ranks`` (the fake world) and ``jl.gather_ranks`` (a real job) both
return a :class:`~jointlab.runtime.rank_view.RankGraphs`; :func:`rank_table`
reads each rank's graph with the same readers a single graph uses
(:func:`~jointlab.analysis.distributed.collectives`,
:func:`~jointlab.analysis.memory.profile.memory_profile`), once per distinct
graph, so ranks can be compared at a glance: which graph each runs, its
nodes, its collectives and the bytes they produce, and its predicted peak.
"""

from __future__ import annotations

import pandas as pd

from jointlab.analysis.distributed import collectives
from jointlab.analysis.memory.profile import memory_profile
from jointlab.runtime.rank_view import RankGraphs

__all__ = ["RANK_COLUMNS", "rank_table"]

RANK_COLUMNS = ["graph", "shared_with", "nodes", "collectives", "comm_bytes", "peak_bytes",
                "forward_peak_bytes", "backward_peak_bytes"]


def rank_table(graphs: RankGraphs) -> pd.DataFrame:
    """One row per rank: its graph's index, nodes, collectives, bytes and predicted peaks.

    Args:
        graphs: What ``jl.trace_ranks`` or ``jl.gather_ranks`` returned.

    Returns:
        A DataFrame indexed by rank with :data:`RANK_COLUMNS`: ``graph`` is the
        index of the rank's class in ``graphs.classes``, ``shared_with`` the other
        ranks of that class; ``comm_bytes`` the bytes its collectives produce on
        that rank; the peaks are each graph's own prediction (state included).
    """
    per_class = {}
    for i, cls in enumerate(graphs.classes):
        joint = graphs.graphs[cls]
        coll, mem = collectives(joint), memory_profile(joint)
        per_class[cls] = [i, len(joint.graph.nodes), len(coll), int(coll.bytes.sum()),
                          mem.peak_bytes, mem.forward_peak_bytes, mem.backward_peak_bytes]
    rows = {}
    for rank in range(graphs.world_size):
        cls = graphs.rank_class(rank)
        graph, *rest = per_class[cls]
        rows[rank] = [graph, tuple(r for r in cls if r != rank), *rest]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=RANK_COLUMNS)
    table.index.name = "rank"
    return table
