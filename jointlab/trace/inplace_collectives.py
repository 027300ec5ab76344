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
import functools
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from jointlab.errors import TrainFnMisuseError
from jointlab.passes.annotate import frame_text, is_user_frame

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


def _refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        caller = traceback.extract_stack(sys._getframe(1), limit=1)
        if not caller or not is_user_frame(caller[-1].filename):
            return original(*args, **kwargs)
        raise TrainFnMisuseError(
            f"train_fn calls the in-place collective torch.distributed.{name}() at "
            f"{frame_text(caller[-1])}. It changes its tensor through the process group, "
            "outside the traced ops, so the joint graph would silently lack it (and "
            "collectives() would list no row). Use the functional collective, which both "
            "modes trace as a graph node: import torch.distributed._functional_collectives "
            f"as funcol; {INPLACE_COLLECTIVES[name]}.")

    return call


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
    saved = [(mod, name, getattr(mod, name)) for mod in (dist, distributed_c10d)
             for name in INPLACE_COLLECTIVES if hasattr(mod, name)]
    try:
        for mod, name, original in saved:
            setattr(mod, name, _refusing(name, original))
        yield
    finally:
        for mod, name, original in reversed(saved):
            setattr(mod, name, original)
