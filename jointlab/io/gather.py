"""Bring every rank's graph archive of a real distributed job to one rank.

Each process of a ``torchrun`` job traces its own graph; :func:`gather_archives`
serialises it with :func:`jointlab.io.persist.archive_bytes` (the pickle-free
archive ``joint.save`` writes) and gathers the bytes with ``torch.distributed``
as ``uint8`` tensors: the sizes first (``all_gather``), then the padded archives
(``gather`` to ``dst``). Nothing is pickled on the way. The tensors live on
the CPU under gloo and on this process's current CUDA device under NCCL.
:func:`jointlab.gather_ranks` (in :mod:`jointlab.graph`) loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from jointlab.errors import JointlabError, PersistError, StateMismatchError
from jointlab.io.persist import archive_bytes

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["gather_archives"]


def _device(group: Any) -> torch.device:
    """Where the backend of ``group`` takes tensors (NCCL: this process's CUDA device)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_archives(joint: TracedGraph, dst: int = 0, group: Any = None
                    ) -> list[bytes] | None:
    """Every rank's archive of its graph, on ``dst``; call it on every rank of ``group``.

    Args:
        joint: This rank's traced graph.
        dst: The world rank that receives them.
        group: The process group (default: the world).

    Returns:
        On ``dst``, one archive per rank of ``group`` in group-rank order; None elsewhere.

    Raises:
        StateMismatchError: No process group is initialised (not a distributed job).
        PersistError: A rank's graph cannot be saved (each rank raises, none hangs).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise StateMismatchError(
            "jl.gather_ranks gathers the graphs of a real distributed job, but no process "
            "group is initialised: call it in every process of the job (torchrun), after "
            "torch.distributed.init_process_group. In one process, jl.trace_ranks traces "
            "every rank of jl.fake_world.")
    try:
        data, failure = archive_bytes(joint), None
    except JointlabError as exc:  # told to every rank below, so none waits for it
        data, failure = b"", exc
    device, size = _device(group), dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(size)]
    mark = -1 if failure is not None else len(data)
    dist.all_gather(sizes, torch.tensor([mark], dtype=torch.int64, device=device), group=group)
    lengths = [int(s.item()) for s in sizes]
    if failure is not None:
        raise failure
    if -1 in lengths:
        raise PersistError(
            f"group rank {lengths.index(-1)} could not save its graph (its own error says "
            "why), so no graphs were gathered.")
    mine = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    receiving = dist.get_rank() == dst
    chunks = ([torch.empty_like(mine) for _ in range(size)] if receiving else None)
    dist.gather(mine, chunks, dst=dst, group=group)
    if not receiving:
        return None
    return [c[:n].cpu().numpy().tobytes() for c, n in zip(chunks or [], lengths)]
