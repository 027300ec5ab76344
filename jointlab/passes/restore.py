"""Restoring an archived graph's meta on load: what :mod:`jointlab.io` decoded, written here.

``jl.load`` (:mod:`jointlab.io.persist`) decodes each node record's meta and
value spec as data, rebuilds the fake values from the specs
(:mod:`jointlab.io.fakes`), and hands the results over; these functions put
them on the decoded graph, so the loader itself writes no meta:

- :func:`restore_meta`: each node's archived meta, ``meta["jointlab"]``
  included, in record order;
- :func:`restore_vals`: ``meta["val"]``, the fake values rebuilt from the
  archived specs (nodes without a spec keep none);
- :func:`mark_archive_version`: the graph module's
  ``meta[ARCHIVE_VERSION_KEY]``, the format version it was read from.

Meta keys written: every key the archive holds for a node (``jointlab``,
``seq_nr``, ``autograd_backward``, ``nn_module_stack``, ``stack_trace``, ...),
``val``; on the graph module, ``jointlab_archive_version``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch.fx as fx

__all__ = ["ARCHIVE_VERSION_KEY", "mark_archive_version", "restore_meta", "restore_vals"]

#: Graph-module meta key holding the archive version a graph was read from.
ARCHIVE_VERSION_KEY = "jointlab_archive_version"


def restore_meta(graph: fx.Graph, metas: Sequence[Mapping[str, Any]]) -> None:
    """Add each node's archived meta to it.

    Args:
        graph: The graph decoded from an archive, one node per record.
        metas: The decoded meta of each record, in node order.
    """
    for node, meta in zip(graph.nodes, metas):
        node.meta.update(meta)


def restore_vals(pairs: Iterable[tuple[fx.Node, Any]]) -> None:
    """Set ``meta["val"]`` of each node to its rebuilt fake value.

    Args:
        pairs: ``(node, value)`` for every node whose archived spec was rebuilt.
    """
    for node, val in pairs:
        node.meta["val"] = val


def mark_archive_version(gm: fx.GraphModule, version: int) -> None:
    """Record on a loaded graph module the archive format version it was read from.

    Args:
        gm: The loaded graph module.
        version: The archive's format version.
    """
    gm.meta[ARCHIVE_VERSION_KEY] = version
