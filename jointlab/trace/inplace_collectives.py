"""In-place ``torch.distributed`` collectives called by the user's code inside ``train_fn``.

``dist.all_reduce(t)`` changes ``t`` in place through the process group,
outside the dispatcher's functional collectives: make_fx records nothing of
it (the graph silently lacks the collective and ``collectives()`` lists no
row), and AOT fails with a message that does not name it. While ``train_fn``
is traced, :func:`inplace_collective_refusals` replaces these functions, and a
call from the user's code raises :class:`~jointlab.errors.TrainFnMisuseError`
naming the collective, the user's line and its functional spelling
(``torch.distributed._functional_collectives``), which both modes trace as
graph nodes. Calls made by torch itself pass through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from jointlab.trace.user_calls import refuse_user_calls

__all__ = ["INPLACE_COLLECTIVES", "inplace_collective_refusals"]

#: In-place c10d collective to its functional spelling (``funcol`` is
#: ``torch.distributed._functional_collectives``).
INPLACE_COLLECTIVES: dict[str, str] = {
    "all_reduce": "t = funcol.all_reduce(t, 'sum', group)",
    "all_gather": "out = funcol.all_gather_tensor(t, 0, group)",
    "all_gather_into_tensor": "out = funcol.all_gather_tensor(t, 0, group)",
    "reduce_scatter": "out = funcol.reduce_scatter_tensor(t, 'sum', 0, group)",
    "reduce_scatter_tensor": "out = funcol.reduce_scatter_tensor(t, 'sum', 0, group)",
    "all_to_all": "out = funcol.all_to_all_single(t, None, None, group)",
    "all_to_all_single": "out = funcol.all_to_all_single(t, None, None, group)",
    "broadcast": "t = funcol.broadcast(t, src, group)",
    "reduce": "t = funcol.all_reduce(t, 'sum', group)",
}


def _collective_refusal(_module: Any, name: str, line: str) -> str:
    return (f"train_fn calls the in-place collective torch.distributed.{name}() at "
            f"{line}. It changes its tensor through the process group, "
            "outside the traced ops, so the joint graph would silently lack it (and "
            "collectives() would list no row). Use the functional collective, which both "
            "modes trace as a graph node: import torch.distributed._functional_collectives "
            f"as funcol; {INPLACE_COLLECTIVES[name]}.")


@contextlib.contextmanager
def inplace_collective_refusals() -> Iterator[None]:
    """Refuse the user's in-place ``torch.distributed`` collectives inside this block.

    Yields:
        Nothing; the originals are back when the block exits, whatever happens.
    """
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except ImportError:  # a torch without distributed: nothing to refuse
        yield
        return
    targets = [(mod, name) for mod in (dist, distributed_c10d) for name in INPLACE_COLLECTIVES]
    with refuse_user_calls(targets, _collective_refusal):
        yield
