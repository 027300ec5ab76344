"""Room on CPython's frame stack for a deep call: no page faults at a chunk boundary.

CPython (3.11 and later) keeps a thread's Python frames on a stack of chunks,
16 KiB each, fresh from ``mmap``, and unmaps a chunk as soon as the first frame
in it returns. A call whose depth goes back and forth across a chunk boundary
maps and unmaps that chunk every time. A trace crosses one thousands of times
when the boundary falls where it works (make_fx's frames on top of the model's,
once per op and per module call): measured on the Mixtral-shaped MoE of
``bench/bench_trace.py``, 9,000 page faults and 15 % of the trace's CPU time,
and none on the bare make_fx trace of the same step. Where the boundary falls
depends on the model, on jointlab's own hooks and modes and on the caller's
depth, so the cost came and went with unrelated changes.

:func:`with_stack_room` makes the call from its own frame, which reserves a
large value stack it never uses: CPython gives that frame a chunk of its own, twice its
size, and the frames the call makes fill the rest of that chunk instead of
crossing into new ones (7 page faults a trace on the same MoE). The reserve is
address space that is never touched, not memory. On an interpreter without
CPython's code objects it is an ordinary call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ROOM_SLOTS", "with_stack_room"]

T = TypeVar("T")

#: Value-stack slots the calling frame reserves (8 bytes each): a frame just over
#: 512 KiB, which CPython places in a 1 MiB chunk, leaving ~512 KiB for the call.
ROOM_SLOTS = 1 << 16


def with_stack_room(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, with its Python frames in one large stack chunk.

    Args:
        fn: The deep call (a trace).
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What ``fn`` returns; exceptions pass through unchanged.
    """
    return fn(*args, **kwargs)


# This function's own frame is the reserve: one frame, not a wrapper and a reserving
# frame, under every stack the trace captures (make_fx records one per node).
try:  # a larger stack than the body needs is harmless: it is only reserved
    with_stack_room.__code__ = with_stack_room.__code__.replace(co_stacksize=ROOM_SLOTS)
except (AttributeError, TypeError, ValueError):  # pragma: no cover - not CPython
    pass
