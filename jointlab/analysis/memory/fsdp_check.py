"""jointlab's per-rank prediction of a SimpleFSDP-style trace against FSDP2's own tracker.

jointlab refuses to trace FSDP2 ``fully_shard`` (its hooks reshard outside
autograd), but it traces the same sharding written as DTensor parameters that
all-gather in the forward (SimpleFSDP style). :func:`track_fsdp_step` runs one
eager step of the ``fully_shard``-ed twin under
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (a dispatch mode
that sizes every storage by category: sharded and unsharded parameters,
sharded and unsharded gradients, activations, backward temporaries,
all-gather and reduce-scatter buffers, optimizer state, inputs); with
:func:`fsdp_memory_check` the two are set side by side, one row per figure.

What agrees and what cannot (measured on torch 2.13, CPU, fake world):

- sharded parameters and gradients, buffers and inputs agree to the byte on
  every rank. Both shard dim 0 like ``torch.chunk`` and keep a short chunk (the
  last ranks of an uneven split) in storage padded to ``ceil(dim0 / world)``
  rows: FSDP2 in its sharded parameters, ``distribute_tensor`` in the SimpleFSDP
  trace's inputs, whose padded storage the prediction counts. The row
  ``sharded param (shards)`` compares the shards' own sizes as well;
- the forward values alive at the forward/backward boundary, all-gathered
  weights left out, agree when the traced code path is eager's (a 2-layer
  MLP); HF attention takes another path while traced (k/v repeated, the mask
  materialised), which shows as a difference;
- all-gathered weights at the boundary differ by design: FSDP2 reshards after
  forward (the root group excepted), SimpleFSDP without recompute keeps
  the ones the backward needs; the peaks differ with them and with FSDP2's
  own buffers (all-gather outputs beside unsharded copies, backward prefetch).
  Those rows say ``comparable=False``.

jointlab's joint graph holds no optimizer step, so optimizer state is not compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from jointlab import torch_compat
from jointlab.analysis.memory.profile import memory_profile
from jointlab.errors import MemoryQueryError
from jointlab.meta import node_info
from jointlab.runtime.dtensor import is_dtensor
from jointlab.torch_compat import fsdp_module_class

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["FSDPStepMemory", "fsdp_memory_check", "track_fsdp_step"]

_STATE = ("param", "buffer", "input")
_SHARDS = "numel x item size of this rank's chunks"
_COLUMNS = ["jointlab", "fsdp2", "difference", "comparable", "matches", "source", "note"]


@dataclass(frozen=True)
class FSDPStepMemory:
    """FSDPMemTracker's figures (bytes by its category names) for one eager FSDP2 step.

    Attributes:
        rank: The rank the step ran as.
        world_size: The number of ranks.
        boundary: Live bytes when ``train_fn`` has returned the loss, before backward.
        end: Live bytes after backward (the loss still held).
        peak: The tracker's peak snapshot.
        shard_bytes: Sum of the sharded parameters' local shard sizes (numel x item size).
        grad_shard_bytes: The same for their gradients after the step.
    """

    rank: int
    world_size: int
    boundary: dict[str, int]
    end: dict[str, int]
    peak: dict[str, int]
    shard_bytes: int
    grad_shard_bytes: int


def is_fsdp2_module(model: nn.Module) -> bool:
    """True when ``model`` itself is ``fully_shard``-ed (FSDPMemTracker's requirement)."""
    cls = fsdp_module_class()
    return cls is not None and isinstance(model, cls)


def one_device(snapshot: dict[Any, dict[Any, int]], what: str) -> dict[str, int]:
    """The category bytes of the one device a tracker snapshot holds memory on."""
    used = {dev: snap for dev, snap in snapshot.items() if snap.get("Total", 0)}
    if len(used) > 1:
        raise MemoryQueryError(
            f"FSDPMemTracker's {what} snapshot holds memory on {len(used)} devices "
            f"({', '.join(map(str, used))}); jointlab predicts one device, so the figures would "
            "not be comparable. Run the FSDP2 step with model, inputs and mesh on one device.")
    snap = next(iter(used.values()), {})
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def local_bytes(tensors: list[Any]) -> int:
    """Sum of numel x item size of each DTensor's local shard (plain tensors as they are)."""
    total = 0
    for t in tensors:
        local = t.to_local() if is_dtensor(t) else t
        total += local.numel() * local.element_size()
    return total


@contextlib.contextmanager
def grads_set_aside(model: nn.Module) -> Iterator[None]:
    """Start the step with no gradients and give the model its own ones back afterwards."""
    params = list(model.parameters())
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _check_world() -> tuple[int, int]:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise MemoryQueryError(
            "track_fsdp_step needs the process group the model was sharded in; call it inside "
            "jl.fake_world(...) (or your own init_process_group), where fully_shard ran.")
    return dist.get_rank(), dist.get_world_size()


def track_fsdp_step(model: nn.Module, train_fn: Callable[..., Any], inputs: dict[str, Any]
                    ) -> FSDPStepMemory:
    """Run one eager step of an FSDP2 model under ``FSDPMemTracker`` and keep its figures.

    The model's gradients are set aside before and given back after the step,
    and the CPU RNG is restored, so the model leaves as it came.

    Args:
        model: A ``fully_shard``-ed model (its root too), in the world it was sharded in.
        train_fn: ``train_fn(model, **inputs) -> loss``, as given to ``jl.trace``.
        inputs: The step's keyword inputs.

    Returns:
        The tracker's snapshots at the forward/backward boundary, at the end and at its peak.

    Raises:
        MemoryQueryError: The root is not ``fully_shard``-ed, no process group is
            initialised, or the tracker saw memory on several devices.
        UnsupportedTorchError: This torch has no ``FSDPMemTracker``.
    """
    if not is_fsdp2_module(model):
        raise MemoryQueryError(
            f"track_fsdp_step: the root module ({type(model).__name__}) is not fully_shard-ed, "
            "and FSDPMemTracker tracks FSDP2 roots only. Call fully_shard(model, mesh=...) on "
            "the root after sharding its blocks.")
    rank, world = _check_world()
    tracker = torch_compat.fsdp_mem_tracker()(model)
    tracker.track_inputs((inputs,))
    with grads_set_aside(model), torch.random.fork_rng(devices=[]):
        with tracker:
            loss = train_fn(model, **inputs)
            boundary = one_device(tracker.get_tracker_snapshot(), "boundary")
            loss.backward()
            end = one_device(tracker.get_tracker_snapshot(), "end")
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        shards, grad_shards = local_bytes(list(model.parameters())), local_bytes(grads)
    return FSDPStepMemory(rank, world, boundary, end,
                          one_device(tracker.get_tracker_snapshot("peak"), "peak"),
                          shards, grad_shards)


def traced_rank(joint: TracedGraph | Any, measured: FSDPStepMemory) -> int:
    """The rank ``joint`` was traced as, checked against the world of ``measured``.

    Raises:
        MemoryQueryError: ``joint`` has no DTensor state, or its mesh size or
            rank differ from those of the measured step.
    """
    specs = [s for s in getattr(joint.runtime, "specs", None) or () if s is not None]
    if not specs:
        raise MemoryQueryError(
            "fsdp_memory_check: this graph was not traced from DTensor parameters, so it holds "
            "no per-rank shards to compare. Trace the SimpleFSDP-style twin of the FSDP2 model "
            "(DTensor parameters that all-gather in the forward) inside the same jl.fake_world.")
    sizes = {s.mesh.size() for s in specs}
    ranks = {s.mesh.get_rank() for s in specs}
    if sizes != {measured.world_size} or ranks != {measured.rank}:
        raise MemoryQueryError(
            f"fsdp_memory_check: the graph was traced as rank {sorted(ranks)} on a mesh of "
            f"{sorted(sizes)} ranks, the FSDP2 step ran as rank {measured.rank} of "
            f"{measured.world_size}; per-rank figures compare only for the same rank and mesh "
            "size. Trace and track in the same jl.fake_world(world_size, rank=...).")
    return measured.rank


def shard_figures(joint: TracedGraph | Any) -> tuple[int, int]:
    """Bytes (numel x item size) of the parameter shards and of their gradients' shards."""
    params = sum(node_info(n).out_bytes for n in joint.placeholders
                 if node_info(n).phase == "param")
    (out,) = [n for n in joint.graph.nodes if n.op == "output"]
    grads = {a for a in torch_compat.pytree.tree_leaves(out.args)
             if isinstance(a, fx.Node) and node_info(a).grad_of is not None}
    return params, sum(node_info(n).out_bytes for n in grads)


def predicted_figures(joint: TracedGraph | Any) -> dict[str, int]:
    """jointlab's figures: state bytes, gradients, and forward values alive into the backward."""
    mem = memory_profile(joint)
    life, b = mem.lifetimes, mem.boundary_step
    by_cat = life.groupby("category")["bytes"].sum()
    across = life[(life.first_step < b) & (life.last_step >= b) & ~life.category.isin(_STATE)]
    gathered = across.op.str.contains("all_gather")
    shards, grad_shards = shard_figures(joint)
    return {**{c: int(by_cat.get(c, 0)) for c in (*_STATE, "gradient")},
            "shards": shards, "grad_shards": grad_shards,
            "kept": int(across.loc[~gathered, "bytes"].sum()),
            "gathered": int(across.loc[gathered, "bytes"].sum()), "peak": mem.peak_bytes}


def _pad_note(storage: tuple[int, int], shards: tuple[int, int]) -> str:
    if storage[0] == storage[1]:
        return "storages holding this rank's shards"
    if shards[0] == shards[1]:
        return ("the storages differ but the shards agree: one side pads a short shard's "
                "storage to ceil(dim0 / world) rows and the other does not")
    return "the shards differ too: not the same model, sharding or rank?"


def fsdp_memory_check(joint: TracedGraph | Any, measured: FSDPStepMemory) -> pd.DataFrame:
    """jointlab's per-rank prediction next to FSDPMemTracker's eager FSDP2 figures.

    Args:
        joint: A SimpleFSDP-style trace (DTensor parameters, all-gathers in the
            forward) of the model ``measured`` ran ``fully_shard``-ed, same rank and mesh size.
        measured: What :func:`track_fsdp_step` recorded for that rank.

    Returns:
        One row per figure (index ``quantity``): ``jointlab`` and ``fsdp2`` bytes,
        ``difference`` (jointlab - fsdp2), ``comparable`` (False where the two
        schedules differ by design), ``matches`` (the two are equal, whatever
        ``comparable`` says), ``source`` (the FSDP2 figure: tracker snapshot
        and category) and ``note``.

    Raises:
        MemoryQueryError: ``joint`` has no DTensor state, or was traced as
            another rank or on another mesh size.
    """
    traced_rank(joint, measured)
    ours, end, bd = predicted_figures(joint), measured.end, measured.boundary
    p_st, g_st = (ours["param"], end.get("Sharded Param", 0)), (ours["gradient"],
                                                                 end.get("Sharded Grad", 0))
    p_sh, g_sh = (ours["shards"], measured.shard_bytes), (ours["grad_shards"],
                                                          measured.grad_shard_bytes)
    rows = [
        ("sharded param (storage)", *p_st, True, "end: Sharded Param", _pad_note(p_st, p_sh)),
        ("sharded param (shards)", *p_sh, True, "FSDP2 parameters' to_local()", _SHARDS),
        ("sharded grad (storage)", *g_st, True, "end: Sharded Grad", _pad_note(g_st, g_sh)),
        ("sharded grad (shards)", *g_sh, True, "FSDP2 gradients' to_local()", _SHARDS),
        ("buffer", ours["buffer"], end.get("Buffer", 0), True, "end: Buffer", ""),
        ("input", ours["input"], end.get("Inputs", 0), True, "end: Inputs", ""),
        ("forward values kept for backward", ours["kept"], bd.get("Activation", 0), True,
         "boundary: Activation", "all-gathered weights left out; the loss included"),
        ("all-gathered weights at boundary", ours["gathered"],
         bd.get("Unsharded Param", 0) + bd.get("All Gather", 0), False,
         "boundary: Unsharded Param + All Gather",
         "FSDP2 reshards after forward (not the root); SimpleFSDP keeps what backward needs"),
        ("peak", ours["peak"], measured.peak.get("Total", 0), False, "peak: Total",
         "different schedules: gathered weights kept vs FSDP2's all-gather buffers, "
         "unsharded copies and backward prefetch"),
    ]
    table = pd.DataFrame([(q, a, f, a - f, c, a == f, s, n) for q, a, f, c, s, n in rows],
                         columns=["quantity", *_COLUMNS]).set_index("quantity")
    table.attrs["rank"] = measured.rank
    return table
