"""Meta for torch's partitioners, written on what-if's own copies of a joint graph.

:mod:`jointlab.analysis.memory.whatif` scores what saving fewer activations
would buy by splitting a functional copy of the joint graph with PyTorch's
partitioners. The meta those copies need is written here, never on the
user's graph:

- :func:`drop_annotations` removes ``meta["jointlab"]`` from every node of a
  copy: the partitioners copy node meta shallowly, so a shared jointlab dict
  would let one split graph's analysis overwrite another's;
- :func:`seed_as_tangent` replaces make_fx's ``ones_like(loss)`` seed by a
  ``tangents_*`` placeholder carrying the seed's meta (``val`` and the rest);
- :func:`tag_forward` writes ``partitioner_tag`` = ``"is_forward"`` on every
  call before the backward's first step (``default_partition`` splits by it).

Meta keys written (torch's keys, not under ``meta["jointlab"]``, except the
removal): ``partitioner_tag``; a copy of the seed's meta on the tangent;
``jointlab`` removed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx

from jointlab.meta import KEY

__all__ = ["drop_annotations", "seed_as_tangent", "tag_forward"]


def drop_annotations(gm: fx.GraphModule) -> None:
    """Remove ``meta["jointlab"]`` from every node of a copy (analysed afresh later).

    Args:
        gm: A copy of a joint graph (never the user's graph).
    """
    for node in gm.graph.nodes:
        node.meta.pop(KEY, None)


def seed_as_tangent(graph: fx.Graph, seed: fx.Node, name: str) -> fx.Node:
    """Replace the backward's seed by a placeholder after the last one, with the seed's meta.

    Args:
        graph: A copy of a make_fx joint graph (never the user's graph).
        seed: Its ``ones_like(loss)`` node; erased.
        name: The new placeholder's name (``tangents_1``).

    Returns:
        The tangent placeholder.
    """
    last_ph = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(last_ph):
        tangent = graph.placeholder(name)
    tangent.meta = dict(seed.meta)
    seed.replace_all_uses_with(tangent)
    graph.erase_node(seed)
    return tangent


def tag_forward(gm: fx.GraphModule, tangent: fx.Node) -> None:
    """Tag every call placed before the backward's first step as forward.

    ``default_partition`` splits by these tags ("respect the original placement").

    Args:
        gm: The functional copy what-if splits (never the user's graph).
        tangent: Its tangent placeholder; its first user starts the backward.
    """
    first_bwd = min((u for u in tangent.users), key=_order(gm), default=None)
    for node in gm.graph.nodes:
        if node is first_bwd:
            break
        if node.op == "call_function":
            node.meta["partitioner_tag"] = "is_forward"


def _order(gm: fx.GraphModule) -> Callable[[fx.Node], int]:
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    return pos.__getitem__
