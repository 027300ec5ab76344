"""Cross-check of the predicted memory against Inductor's own estimator.

``torch._inductor.fx_passes.memory_estimator.build_memory_profile`` walks an FX
graph's fake values storage by storage: a storage is allocated by the first
node whose value lives in it and freed after the last node that reads it,
except where the caller says its allocator is not releasable. Given that
graph inputs and ``get_attr`` constants are held for the whole run (as
:mod:`jointlab.analysis.memory.predict` assumes), its peak on a joint graph
equals jointlab's to the byte, with two deliberate differences, both on
jointlab's side measured against the CPU profiler (``tests/test_scaleout.py``):

- a reducing loss kernel (``mse_loss`` and the rest of
  ``predict._REDUCES_INTO_FULL_BUFFER``) returns a 0-d tensor that keeps an
  input-sized storage on CPU (torch 2.13); the fake value's storage is 4 bytes, so
  Inductor's estimator (which would generate its own reduction) counts 4;
- a value nobody reads is freed by the generated code right after its node;
  the estimator, which frees only at a last *use*, keeps it to the end. In bf16
  the meta math attention path casts each softmax into such a copy: on the
  Llama-70B shape (batch 1, seq 4096) each is 2 GiB and Inductor's peak is
  4 GiB above jointlab's at 2 layers.

Inductor's estimator counts only storages off the CPU (its ``device_filter``),
so it answers 0 for a graph traced on CPU tensors: :func:`inductor_memory_profile`
refuses such a graph instead. Trace on the meta device to compare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.fx as fx

from jointlab import torch_compat
from jointlab.errors import MemoryQueryError
from jointlab.passes.analyze import tensors_of

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["inductor_memory_profile", "inductor_peak_bytes"]


def holds_whole_run(node: fx.Node) -> bool:
    """True for the values jointlab holds for the whole run (inputs, state, constants)."""
    return node.op in ("placeholder", "get_attr")


def cpu_values(graph: fx.Graph) -> list[str]:
    """Names of the nodes whose value has a tensor on the CPU."""
    return [n.name for n in graph.nodes
            if any(t.device.type == "cpu" for t in tensors_of(n.meta.get("val")))]


def inductor_memory_profile(joint: TracedGraph | Any) -> list[int]:
    """Live bytes over one run by Inductor's ``build_memory_profile``.

    Args:
        joint: A traced joint graph (or a GraphModule) whose values are on a
            device other than the CPU, e.g. traced on the meta device.

    Returns:
        Inductor's profile: the bytes held before the first op, then two entries
        per op (after its allocations, after its frees).

    Raises:
        MemoryQueryError: Some values are CPU tensors, which Inductor's
            estimator leaves out, so its figure would look right and be wrong.
        UnsupportedTorchError: This torch has no ``build_memory_profile``.
    """
    gm = getattr(joint, "graph_module", joint)
    on_cpu = cpu_values(gm.graph)
    if on_cpu:
        raise MemoryQueryError(
            f"Inductor's memory estimator counts only storages off the CPU, and "
            f"{len(on_cpu)} values of this graph are CPU tensors (first: {on_cpu[0]}), so "
            "its figure would leave them out. Trace on the meta device "
            "(with torch.device('meta'): model = build()) to cross-check against it.")
    return list(torch_compat.build_memory_profile(gm.graph, lambda n: not holds_whole_run(n)))


def inductor_peak_bytes(joint: TracedGraph | Any) -> int:
    """Peak of :func:`inductor_memory_profile` (see there for arguments and errors).

    Args:
        joint: A traced joint graph whose values are off the CPU.

    Returns:
        The peak in bytes, to compare with ``joint.memory().peak_bytes``.
    """
    return int(max(inductor_memory_profile(joint), default=0))
