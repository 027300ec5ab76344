"""The graph passes of ``jl.trace``, in one declared order, run once by :func:`run_passes`.

Everything that edits a joint graph after tracing is a pass here: the tracing
mode only records what it alone could see (:class:`TraceFacts`: the mode's
classification rules, the module probes, the model's module names, which ops
to retarget, the attention calls made on the meta device, the nodes
checkpoint's recompute created) and hands the raw graph over;
:func:`run_passes` then runs :data:`PIPELINE` top to bottom.
After a user's edit, ``JointGraph.recompute`` calls :func:`reanalyze`, the
only pass that depends on the graph alone. The graph object runs no pass.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from jointlab.passes.analyze import ensure_analyzed, forget_analysis
from jointlab.passes.annotate import ModeRules, annotate
from jointlab.passes.meta_attention import flag_meta_attention
from jointlab.passes.module_paths import absolute_module_paths
from jointlab.passes.probes import write_probes
from jointlab.passes.recompute import tag_recompute
from jointlab.passes.repair import repair_views

__all__ = ["PIPELINE", "PassStep", "TraceFacts", "reanalyze", "retarget", "run_passes"]


@dataclass(frozen=True)
class TraceFacts:
    """What only the trace could see, handed to the passes with the raw graph.

    Attributes:
        rules: The tracing mode's classification (:mod:`jointlab.passes.classify`).
        probes: The module probes (``outputs``, ``grads``, ``returned``).
        module_names: Every module path of the model (``remove_duplicate=False``),
            or None when the mode names modules absolutely itself (AOT).
        retargets: Op -> replacement op for nodes to retarget (e.g. oneDNN's RNN
            layer -> the kernel that keeps its workspace under ``no_grad``).
        sdpa_calls: The attention calls made on the meta device.
        recomputed: The nodes made while gradient checkpointing recomputed a
            forward region (make_fx mode; :mod:`jointlab.passes.recompute`).
    """

    rules: ModeRules
    probes: Any
    module_names: Collection[str] | None = None
    retargets: Mapping[Any, Any] = field(default_factory=dict)
    sdpa_calls: tuple[dict[str, Any], ...] = ()
    recomputed: tuple[fx.Node, ...] = ()


def retarget(gm: fx.GraphModule, targets: Mapping[Any, Any]) -> int:
    """Point every ``call_function`` node whose target is a key of ``targets`` at its value.

    Args:
        gm: The joint graph; edited in place and recompiled if changed.
        targets: Op -> replacement op (same schema).

    Returns:
        How many nodes were retargeted.
    """
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets:
            node.target = targets[node.target]
            changed += 1
    if changed:
        gm.recompile()
    return changed


def _module_paths(gm: fx.GraphModule, facts: TraceFacts) -> None:
    if facts.module_names is not None:  # a shared submodule: true FQNs
        absolute_module_paths(gm, facts.module_names)


def _probes(gm: fx.GraphModule, facts: TraceFacts) -> None:
    write_probes(gm, facts.probes.outputs, facts.probes.grads, facts.probes.returned)


@dataclass(frozen=True)
class PassStep:
    """One pass of :data:`PIPELINE`: its name and ``run(gm, facts)``."""

    name: str
    run: Callable[[fx.GraphModule, TraceFacts], Any]


#: The passes of ``jl.trace``, in the order they run (each reads what those above wrote).
PIPELINE: tuple[PassStep, ...] = (
    PassStep("recompute tags", lambda gm, facts: tag_recompute(gm, facts.recomputed)),
    PassStep("module paths", _module_paths),
    PassStep("annotate", lambda gm, facts: annotate(gm, facts.rules)),
    PassStep("probes", _probes),
    PassStep("view repair", lambda gm, facts: repair_views(gm)),
    PassStep("retarget", lambda gm, facts: retarget(gm, facts.retargets)),
    PassStep("analysis", lambda gm, facts: ensure_analyzed(gm)),
    PassStep("meta attention", lambda gm, facts: flag_meta_attention(gm, list(facts.sdpa_calls))),
)


def run_passes(gm: fx.GraphModule, facts: TraceFacts) -> None:
    """Run every pass of :data:`PIPELINE` once, in order, on a freshly traced graph.

    Args:
        gm: The raw joint graph from a tracing mode; edited and annotated in place.
        facts: What the trace recorded for the passes.
    """
    for step in PIPELINE:
        step.run(gm, facts)


def reanalyze(gm: fx.GraphModule) -> None:
    """Redo the per-node analysis of an edited graph (the trace-time annotations stay).

    Args:
        gm: The joint graph, already recompiled.
    """
    forget_analysis(gm)
    ensure_analyzed(gm)
