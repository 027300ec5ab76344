"""Refuse seed and RNG-state calls made by the user's code inside ``train_fn``.

``torch.manual_seed(42)`` inside a forward is a Python side effect: tracing
runs it once, the graph holds no trace of it, so every random op after it
draws from whatever stream the generator holds when the graph runs. Eager
reseeds on every call, the graph does not, and nothing would say so (PyTorch's
own OpInfo samples wrap ``bernoulli`` and ``rrelu`` in exactly this). Left
alone, tracing would also reseed the user's generator.

:func:`seed_call_refusals` replaces the seeding functions while ``train_fn``
runs and raises :class:`~jointlab.errors.TrainFnMisuseError` with the user's
line before the call changes anything. Calls made by torch itself or by
jointlab (``fork_rng``, checkpointing's RNG replay) pass through untouched.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab.errors import TrainFnMisuseError
from jointlab.passes.annotate import frame_text, is_user_frame

#: (module, function) pairs that seed or set a torch generator's state.
SEED_CALLS: tuple[tuple[Any, str], ...] = (
    *((torch, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.random, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.cuda, n) for n in ("manual_seed", "manual_seed_all", "seed", "seed_all",
                                "set_rng_state", "set_rng_state_all")),
)


def _called_by_user() -> traceback.FrameSummary | None:
    """The frame that called the seeding function, if it is the user's code."""
    caller = traceback.extract_stack(sys._getframe(2), limit=1)
    return caller[-1] if caller and is_user_frame(caller[-1].filename) else None


def _refusing(module: Any, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    spelled = f"{module.__name__}.{name}"

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        frame = _called_by_user()
        if frame is None:
            return original(*args, **kwargs)
        raise TrainFnMisuseError(
            f"train_fn calls {spelled}() at {frame_text(frame)}. A seed call is Python "
            "state: the joint graph cannot replay it, so every random op after it would "
            "draw another stream than eager does, silently. Seed outside train_fn, before "
            "each step (torch.manual_seed(s); joint.run(model, inputs)), or pass seed=s "
            "to jl.compare / jl.Stepper, which seed eager and the graph alike."
        )

    return call


@contextlib.contextmanager
def seed_call_refusals() -> Iterator[None]:
    """Refuse the user's seed and RNG-state calls inside this block.

    Yields:
        Nothing; the originals are back when the block exits, whatever happens.
    """
    saved = [(mod, name, getattr(mod, name)) for mod, name in SEED_CALLS if hasattr(mod, name)]
    try:
        for mod, name, original in saved:
            setattr(mod, name, _refusing(mod, name, original))
        yield
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)
