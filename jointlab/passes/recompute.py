"""Recompute tags: the nodes gradient checkpointing created while it recomputed a forward.

While make_fx traces, :mod:`jointlab.trace.checkpoint` records every node the
graph gains while ``torch.utils.checkpoint`` runs a checkpointed region again
in backward (including the generator-state reads and writes that replay its
random draws) and hands them over as ``TraceFacts.recomputed``.
:func:`tag_recompute` tags those that are still in the final graph; the
annotation pass (:mod:`jointlab.passes.annotate`) turns the tag into the
``recompute`` flag. AOT mode hands none: its export differentiates the
checkpointed regions directly, without a recompute.

Meta keys written (not under ``meta["jointlab"]``; read by the annotation pass):

- :data:`jointlab.meta.RECOMPUTE_TAG` (``jointlab_checkpoint_recompute``):
  True on each node a checkpoint recompute created.
"""

from __future__ import annotations

from collections.abc import Collection

import torch.fx as fx

from jointlab.meta import RECOMPUTE_TAG

__all__ = ["tag_recompute"]


def tag_recompute(gm: fx.GraphModule, recomputed: Collection[fx.Node]) -> int:
    """Tag the nodes of ``gm`` that a checkpoint recompute created.

    Args:
        gm: The raw joint graph; its nodes' meta is edited in place.
        recomputed: The nodes the trace saw created during recomputes (nodes
            erased since, or of another graph, are skipped).

    Returns:
        How many nodes were tagged.
    """
    if not recomputed:
        return 0
    made = set(recomputed)
    tagged = 0
    for node in gm.graph.nodes:
        if node in made:
            node.meta[RECOMPUTE_TAG] = True
            tagged += 1
    return tagged
