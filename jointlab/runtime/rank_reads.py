"""The ranks the user's code reads while traced: recorded, or answered as one rank.

Code that branches on the rank (``y * 2 if dist.get_rank() == 0 else y``)
is traced for one rank: the graph holds that rank's branch and nothing in it
says so. :func:`rank_reads` wraps the functions that tell the rank
(``torch.distributed.get_rank``, ``DeviceMesh.get_rank``,
``get_local_rank`` and ``get_coordinate``) while ``train_fn`` is traced.
A call from the user's code (not torch's own, e.g. DTensor's sharding
arithmetic) is answered as before and recorded as a ``rank``
:class:`~jointlab.assumptions.Assumption`: what it read, the user's line, and
which world ranks read the same value there. ``jl.trace_ranks`` traces the
ranks that read differently separately; a graph refuses to run as a rank
outside the recorded ones.

``answer_as=r`` makes the same calls answer as rank ``r`` instead (plain
ints), for ``jl.run_all_ranks``'s eager check: under ``LocalTensorMode``
torch answers a mesh rank with a per-rank ``SymInt`` whose ``bool()`` is
silently False where the ranks differ, and ``dist.get_rank()`` with 0 for
every rank.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab import torch_compat as compat
from jointlab.assumptions import Assumption
from jointlab.errors import UnsupportedWrapperError
from jointlab.patching import patched
from jointlab.sources import frame_text, innermost_user_frame, is_generated, user_caller

__all__ = ["rank_reads"]

_MESH_READS = ("get_rank", "get_local_rank", "get_coordinate", "_sym_get_coordinate")
#: Reads by which torch's own code may choose values (recorded when torch makes them).
_TORCH_COORDINATE_READS = ("mesh.get_local_rank", "mesh.get_coordinate",
                           "mesh._sym_get_coordinate")


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, torch.SymInt) or (value is not None and not isinstance(value, int)):
        if compat.every_rank_mode_active():
            raise UnsupportedWrapperError(
                f"the user's code read the rank as {value!r}, not a plain int, while jl.trace "
                "ran (inside a LocalTensorMode, every rank at once); trace outside "
                "world.all_ranks().")
        raise UnsupportedWrapperError(
            f"a rank or mesh coordinate was read as {value!r}, a symbolic int, not the plain "
            "int of the rank being traced (torch answers so when it compiles for one rank "
            "with symbolic coordinates), so jointlab cannot tell which ranks the graph is "
            "right for. Trace with mode='make_fx', or without "
            "torch.distributed.config.compile_on_one_rank.")
    return value


def _world_answers(group: Any = None) -> dict[int, int]:
    """What each world rank reads from ``torch.distributed.get_rank(group)``."""
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return {r: r for r in range(dist.get_world_size())}
    # Another group: only this process's group is known; its members read their index.
    return {r: i for i, r in enumerate(dist.get_process_group_ranks(group))}


def _mesh_answers(name: str, mesh: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> dict[int, Any]:
    """What each rank of ``mesh`` reads from ``mesh.<name>(...)``."""
    coords = compat.mesh_coordinates(mesh)
    if name == "get_rank":
        return {r: r for r in coords}
    if name == "get_coordinate":
        return {r: tuple(c) for r, c in coords.items()}
    dim = args[0] if args else kwargs.get("mesh_dim", kwargs.get("index"))
    dim = mesh.mesh_dim_names.index(dim) if isinstance(dim, str) else dim or 0
    return {r: c[dim] for r, c in coords.items()}


def _spelled(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(shown)})"


def _torch_read(caller: Any, call: str, value: Any, per_rank: dict[int, Any]
                ) -> Assumption | None:
    """A ``rank`` fact for torch's own coordinate read at ``caller``, unless it only sizes.

    DTensor picks values by the coordinate (the chunk a ``Replicate -> Shard``
    redistribute keeps, a vocab-parallel embedding's mask offset); a graph traced as
    one rank holds that rank's choice, so only the ranks that read the same value may
    run it. The fact's source is the user's line that led there.
    """
    reader = compat.coordinate_reader(caller)
    if reader is None:
        return None
    value = _plain(value)
    ranks = tuple(sorted(r for r, v in per_rank.items() if v == value))
    backward = compat.backward_node_name()
    user = innermost_user_frame(traceback.extract_stack(caller),
                                also_skip=is_generated)
    if backward is not None:  # the user's innermost frame is only the jl.trace call
        where = f"the backward, in autograd's {backward}"
    else:
        where = frame_text(user) if user is not None else "torch at jl.trace"
    return Assumption("rank", f"{call} in torch's DTensor {reader}", "coordinate", value,
                      where, ranks)


def _wrap(original: Callable[..., Any], spelled: str, answers: Callable[..., dict[int, Any]],
          facts: list[Assumption], answer_as: int | None, torch_reads: bool
          ) -> Callable[..., Any]:
    method = spelled.startswith("mesh.")
    coordinate = torch_reads and spelled in _TORCH_COORDINATE_READS

    @functools.wraps(original)
    def read(*args: Any, **kwargs: Any) -> Any:
        frame = user_caller(2)
        call = spelled + _spelled(args[1:] if method else args, kwargs)
        if frame is None:
            value = original(*args, **kwargs)
            if coordinate:
                fact = _torch_read(sys._getframe(1), call, value, answers(*args, **kwargs))
                if fact is not None:
                    facts.append(fact)
            return value
        per_rank = answers(*args, **kwargs)
        if answer_as is not None:
            if answer_as not in per_rank:
                raise UnsupportedWrapperError(
                    f"{call} at {frame_text(frame)} has no answer for rank {answer_as} "
                    "(it is not in that group); ask the mesh: mesh.get_local_rank(mesh_dim).")
            return per_rank[answer_as]
        value = _plain(original(*args, **kwargs))
        ranks = tuple(sorted(r for r, v in per_rank.items() if v == value))
        facts.append(Assumption("rank", call, "rank", value, frame_text(frame), ranks))
        return value

    return read


def _patches(facts: list[Assumption], answer_as: int | None, torch_reads: bool
             ) -> list[tuple[Any, str, Any]]:
    import torch.distributed as dist
    from torch.distributed import device_mesh, distributed_c10d

    current = dist.get_rank
    get_rank = _wrap(current, "torch.distributed.get_rank", _world_answers, facts, answer_as,
                     False)
    out = [(mod, "get_rank", get_rank) for mod in (dist, distributed_c10d, device_mesh)
           if getattr(mod, "get_rank", None) is current]
    for name in _MESH_READS:
        def mesh(self: Any, *args: Any, _name: str = name, **kwargs: Any) -> dict[int, Any]:
            return _mesh_answers(_name, self, args, kwargs)
        method = getattr(device_mesh.DeviceMesh, name)
        out.append((device_mesh.DeviceMesh, name,
                    _wrap(method, f"mesh.{name}", mesh, facts, answer_as, torch_reads)))
    return out


@contextlib.contextmanager
def rank_reads(answer_as: int | None = None, torch_reads: bool = False
               ) -> Iterator[list[Assumption]]:
    """Record (or answer as ``answer_as``) every rank read by the user's code inside.

    Args:
        answer_as: None to record each read (value, line, ranks that read the same);
            a world rank to answer every read as that rank instead.
        torch_reads: Also record torch's own coordinate reads that may choose values
            (``compat.coordinate_reader``), as tracing needs; not while every rank runs
            at once under ``LocalTensorMode``, where torch answers each rank itself.

    Yields:
        The recorded ``rank`` facts (deduplicated on exit); nothing is recorded
        without an initialised process group.
    """
    import torch.distributed as dist

    facts: list[Assumption] = []
    if not (dist.is_available() and dist.is_initialized()):
        yield facts
        return
    with patched(_patches(facts, answer_as, torch_reads and answer_as is None)):
        yield facts
    facts[:] = list(dict.fromkeys(facts))
