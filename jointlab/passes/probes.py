"""Probe pass: mark the nodes that are module outputs and the gradients reaching them.

The tracer's hooks (:mod:`jointlab.trace.probe_hooks`) record, while tracing,
which graph node *is* each module call's output leaf and which node is the
gradient reaching it. This pass writes those identities into the meta of the
final graph (which may be a copy of the traced one).

A module may fill its output in place after creating it (RecurrentGemma's
RG-LRU: ``out = zeros_like(h); out[:, t] = ...``). make_fx records those writes
as in-place ops on views of the output node, so that node's value *as produced*
is the zeros, and the value the module returned is what the node holds after
the last such write before the module returned. AOT mode's graph is functional:
the output node is the returned value, and no write falls in between.

Writes, under ``node.meta["jointlab"]`` (schema in :mod:`jointlab.meta`):

- ``probe_out``: list of ``[fqn, call, leaf]`` keys the node is the output of;
- ``probe_grad``: list of ``[fqn, call, leaf]`` keys the node is the gradient of;
- ``probe_settled``: list of ``[fqn, call, leaf]`` keys whose output node holds
  the returned value once this node (the last in-place write to that output's
  storage before the module returned) has run.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.fx as fx

from jointlab.meta import KEY
from jointlab.passes.analyze import written_args
from jointlab.torch_compat import storage_id

#: ``(module fqn, call index, output leaf index)``.
Key = tuple[str, int, int]


def write_probes(gm: fx.GraphModule, outputs: Mapping[Key, fx.Node],
                 grads: Mapping[Key, fx.Node],
                 returned: Mapping[Key, fx.Node] | None = None) -> None:
    """Write ``probe_out`` / ``probe_grad`` / ``probe_settled`` on the recorded nodes of ``gm``.

    Args:
        gm: The traced graph (or a copy whose nodes keep the recorded names).
        outputs: Module output key to the node that produced it while tracing.
        grads: Module output key to the node that produced its gradient.
        returned: Module output key to the graph's last node when the module
            returned it (in-place writes up to there are part of the output).
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    settled = settling_writes(gm, outputs, returned or {})
    for key_name, found in (("probe_out", outputs), ("probe_grad", grads),
                            ("probe_settled", settled)):
        for key, node in found.items():
            same = _same_node(by_name.get(node.name), node)
            if same is not None:
                same.meta.setdefault(KEY, {}).setdefault(key_name, []).append(list(key))


def settling_writes(gm: fx.GraphModule, outputs: Mapping[Key, fx.Node],
                    returned: Mapping[Key, fx.Node]) -> dict[Key, fx.Node]:
    """Per module output, the last in-place write to its storage before the module returned.

    Args:
        gm: The traced graph (or a copy whose nodes keep the recorded names).
        outputs: Module output key to the node that produced it while tracing.
        returned: Module output key to the graph's last node when the module returned.

    Returns:
        The writing node of ``gm`` for each output that was written in place
        between its creation and its module's return (others are absent).
    """
    if not returned:
        return {}
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    by_name = {n.name: n for n in nodes}
    writes: dict[int, list[tuple[int, fx.Node]]] = {}
    for i, n in enumerate(nodes):
        for arg in written_args(n):
            if (sid := _storage(arg)) is not None:
                writes.setdefault(sid, []).append((i, n))
    out: dict[Key, fx.Node] = {}
    for key, recorded in outputs.items():
        node = _same_node(by_name.get(recorded.name), recorded)
        end = returned.get(key)
        end = _same_node(by_name.get(end.name), end) if end is not None else None
        sid = _storage(node) if node is not None else None
        if end is None or sid is None:
            continue
        hits = [w for i, w in writes.get(sid, ()) if order[node] < i <= order[end]]
        if hits:
            out[key] = hits[-1]
    return out


def _storage(node: fx.Node) -> int | None:
    """The storage identity of ``node``'s traced value (None for a non-tensor)."""
    val = node.meta.get("val")
    return storage_id(val) if isinstance(val, torch.Tensor) else None


def _same_node(candidate: fx.Node | None, recorded: fx.Node) -> fx.Node | None:
    """``candidate`` when it is the recorded node, or its copy in a copied graph."""
    if candidate is None or candidate.op == "output":
        return None
    if candidate is recorded or (candidate.op, candidate.target) == (recorded.op,
                                                                    recorded.target):
        return candidate
    return None
