"""Per-kernel timings of a stepped compiled graph, summed back to modules.

A :class:`jointlab.analysis.step.compiled.CompiledStepper` times every kernel
call it runs (wall time of the kernel's piece of the generated code, which
also holds the allocations and frees around the call; synchronized before and
after on CUDA). :func:`kernel_timings` gives them one row per kernel call;
:func:`module_timings` sums them back to modules next to the uncompiled
graph's per-node times under the same seed, stepped node by node on the same
device.

A kernel that fuses nodes of several modules has one time: it is split over
those modules in proportion to how many of its covered compute nodes each
holds (all covered nodes where it covers no compute node). A kernel that only
writes layout copies Inductor added (:func:`jointlab.analysis.kernels.kernel_copies`:
torch 2.11 copies the attention output before the attention backward) is work
no node of the traced graph asked for: it is counted under
``"(layout copies)"``. A kernel call no node maps to for any other reason is
counted under ``"(unmapped)"``; neither is ever spread over modules by guess.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from jointlab import meta as _meta
from jointlab.analysis.kernels import is_compute, kernel_copies, kernel_kind, phase_label
from jointlab.analysis.step.runner import NodeRunner

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["kernel_timings", "module_timings", "uncompiled_node_times"]

UNMAPPED = "(unmapped)"
LAYOUT_COPIES = "(layout copies)"
ROOT = _meta.ROOT_LABEL


def kernel_timings(stepper: Any) -> pd.DataFrame:
    """One row per kernel call the stepper has run: its kind, modules, phase and time.

    Args:
        stepper: A :class:`~jointlab.analysis.step.compiled.CompiledStepper`.

    Returns:
        A DataFrame indexed by kernel call (run order) with ``kind``, ``modules``,
        ``phase`` (labelled as the kernel table labels it,
        :func:`jointlab.analysis.kernels.phase_label`: ``"forward+backward"``),
        ``nodes`` (how many joint nodes it covers) and ``step_s``.
    """
    import pandas as pd

    by_name = {n.name: n for n in stepper.joint.graph.nodes}
    copy_kernels = kernel_copies(stepper.compiled)
    rows = []
    for kernel, seconds in stepper.timings.items():
        nodes = [by_name[n] for n in stepper.covers.get(kernel, ())]
        info = stepper.kernel_info(kernel)
        kind = kernel_kind(kernel, nodes, copies=kernel in copy_kernels)
        rows.append({"kernel": kernel, "kind": kind,
                     "modules": info["modules"], "phase": phase_label(nodes),
                     "nodes": len(nodes), "step_s": seconds})
    cols = ["kernel", "kind", "modules", "phase", "nodes", "step_s"]
    return pd.DataFrame(rows, columns=cols).set_index("kernel")


def _module_key(node: Any) -> str:
    return _meta.module(node) or ROOT


def kernel_shares(nodes: list[Any], copy: bool = False) -> dict[str, float]:
    """How a kernel's time is split over modules (fractions summing to 1).

    Args:
        nodes: The joint-graph nodes the kernel covers.
        copy: The kernel only writes layout copies Inductor added.

    Returns:
        ``{module key: fraction}``.
    """
    if copy:
        return {LAYOUT_COPIES: 1.0}
    counted = [n for n in nodes if is_compute(n)] or nodes
    if not counted:
        return {UNMAPPED: 1.0}
    shares: dict[str, float] = {}
    for n in counted:
        key = _module_key(n)
        shares[key] = shares.get(key, 0.0) + 1.0 / len(counted)
    return shares


def uncompiled_node_times(stepper: Any, repeat: int = 1) -> dict[str, float]:
    """Per node, the best wall time of the uncompiled graph stepped node by node.

    Args:
        stepper: A compiled stepper (its source graph, model, inputs, seed and device).
        repeat: How many node-by-node runs to take the minimum over.

    Returns:
        ``{node name: seconds}`` (synchronized on CUDA).
    """
    sync = stepper.device.type == "cuda"
    runner = NodeRunner(stepper.joint, stepper.model, stepper.inputs, device=stepper.device,
                        seed=stepper.seed)
    best: dict[str, float] = {}
    for _ in range(max(1, repeat)):
        runner.reset()
        while not runner.done:
            name = runner.nodes[runner.position].name
            if sync:
                torch.cuda.synchronize(stepper.device)
            t0 = time.perf_counter()
            runner.step_node()
            if sync:
                torch.cuda.synchronize(stepper.device)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    return best


def module_timings(stepper: Any, repeat: int = 1) -> pd.DataFrame:
    """Kernel times summed back to modules, next to the uncompiled graph's node times.

    Args:
        stepper: A compiled stepper that has run kernel calls (its :attr:`timings`).
        repeat: Node-by-node runs of the uncompiled graph to take the best time of.

    Returns:
        A DataFrame indexed by module FQN (``"(root)"`` for the root's own nodes,
        ``"(layout copies)"`` for kernels that only write Inductor's layout copies,
        ``"(unmapped)"`` for other kernel calls no node maps to) with ``compiled_s`` (its
        share of kernel time), ``kernels`` (kernel calls touching it),
        ``uncompiled_s`` (sum of its nodes' times) and ``nodes``; sorted by
        ``compiled_s``, largest first.
    """
    import pandas as pd

    by_name = {n.name: n for n in stepper.joint.graph.nodes}
    copy_kernels = kernel_copies(stepper.compiled)
    compiled: dict[str, float] = {}
    kernels: dict[str, int] = {}
    for kernel, seconds in stepper.timings.items():
        nodes = [by_name[n] for n in stepper.covers.get(kernel, ())]
        for key, share in kernel_shares(nodes, kernel in copy_kernels).items():
            compiled[key] = compiled.get(key, 0.0) + share * seconds
            kernels[key] = kernels.get(key, 0) + 1
    uncompiled: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, seconds in uncompiled_node_times(stepper, repeat).items():
        key = _module_key(by_name[name])
        uncompiled[key] = uncompiled.get(key, 0.0) + seconds
        counts[key] = counts.get(key, 0) + 1
    keys = sorted(set(compiled) | set(uncompiled))
    df = pd.DataFrame({"compiled_s": [compiled.get(k, 0.0) for k in keys],
                       "kernels": [kernels.get(k, 0) for k in keys],
                       "uncompiled_s": [uncompiled.get(k, 0.0) for k in keys],
                       "nodes": [counts.get(k, 0) for k in keys]},
                      index=pd.Index(keys, name="module"))
    return df.sort_values("compiled_s", ascending=False)
