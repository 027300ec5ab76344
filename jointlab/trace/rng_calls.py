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
from collections.abc import Iterator
from typing import Any

import torch

from jointlab.trace.user_calls import refuse_user_calls

#: (module, function) pairs that seed or set a torch generator's state.
SEED_CALLS: tuple[tuple[Any, str], ...] = (
    *((torch, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.random, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.cuda, n) for n in ("manual_seed", "manual_seed_all", "seed", "seed_all",
                                "set_rng_state", "set_rng_state_all")),
)


def _seed_refusal(module: Any, name: str, line: str) -> str:
    return (f"train_fn calls {module.__name__}.{name}() at {line}. A seed call is Python "
            "state: the joint graph cannot replay it, so every random op after it would "
            "draw another stream than eager does, silently. Seed outside train_fn, before "
            "each step (torch.manual_seed(s); joint.run(model, inputs)), or pass seed=s "
            "to jl.compare / jl.Stepper, which seed eager and the graph alike.")


@contextlib.contextmanager
def seed_call_refusals() -> Iterator[None]:
    """Refuse the user's seed and RNG-state calls inside this block.

    Yields:
        Nothing; the originals are back when the block exits, whatever happens.
    """
    with refuse_user_calls(SEED_CALLS, _seed_refusal):
        yield
