"""Probe pass: mark the nodes that are module outputs and the gradients reaching them.

The tracer's hooks (:mod:`jointlab.trace.probe_hooks`) record, while tracing,
which graph node *is* each module call's output leaf and which node is the
gradient reaching it. This pass writes those identities into the meta of the
final graph (which may be a copy of the traced one).

Writes, under ``node.meta["jointlab"]`` (schema in :mod:`jointlab.meta`):

- ``probe_out``: list of ``[fqn, call, leaf]`` keys the node is the output of;
- ``probe_grad``: list of ``[fqn, call, leaf]`` keys the node is the gradient of.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx as fx

from jointlab.meta import KEY

#: ``(module fqn, call index, output leaf index)``.
Key = tuple[str, int, int]


def write_probes(gm: fx.GraphModule, outputs: Mapping[Key, fx.Node],
                 grads: Mapping[Key, fx.Node]) -> None:
    """Write ``probe_out`` / ``probe_grad`` on the nodes of ``gm`` that were recorded.

    Args:
        gm: The traced graph (or a copy whose nodes keep the recorded names).
        outputs: Module output key to the node that produced it while tracing.
        grads: Module output key to the node that produced its gradient.
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    for key_name, found in (("probe_out", outputs), ("probe_grad", grads)):
        for key, node in found.items():
            same = _same_node(by_name.get(node.name), node)
            if same is not None:
                same.meta.setdefault(KEY, {}).setdefault(key_name, []).append(list(key))


def _same_node(candidate: fx.Node | None, recorded: fx.Node) -> fx.Node | None:
    """``candidate`` when it is the recorded node, or its copy in a copied graph."""
    if candidate is None or candidate.op == "output":
        return None
    if candidate is recorded or (candidate.op, candidate.target) == (recorded.op,
                                                                    recorded.target):
        return candidate
    return None
