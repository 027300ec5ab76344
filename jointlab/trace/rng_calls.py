"""Refuse every seed and generator-state call made while ``train_fn`` is traced, by whoever.

``torch.manual_seed(42)`` inside a forward is a Python side effect: tracing
runs it once, the graph holds no trace of it, so every random op after it
draws from whatever stream the generator holds when the graph runs. Eager
reseeds on every call, the graph does not, and nothing would say so. It does
not matter who makes the call: PyTorch's own OpInfo samples wrap
``bernoulli`` and ``rrelu`` in ``wrapper_set_seed``, a library helper in
``torch/testing``, and its reseed is as lost as the user's own. Left alone,
tracing would also reseed the user's generator.

:func:`seed_call_refusals` judges each call by its effect, not by its caller:

- a seed (``torch.manual_seed``, ``torch.seed``, the CUDA ``manual_seed*`` and
  ``seed*``, ``set_rng_state_all``) is refused for every caller, naming the
  function that made it and the user's line that led to it, before it
  changes anything;
- ``torch.set_rng_state`` (CPU or CUDA) is kept where the graph records it: in
  make_fx mode :mod:`jointlab.trace.checkpoint` turns it into a
  generator-state node, so ``torch.random.fork_rng`` inside ``train_fn``
  replays exactly; in AOT mode nothing records it and it is refused;
- and as a backstop for a call that bypasses these functions
  (``torch.default_generator.manual_seed(...)``, or a seeding function bound
  by name before ``jl.trace``), the default CPU generator's state is compared
  when ``train_fn`` returns: tracing draws from fake tensors only, so a
  changed state means something set it. The state is put back and the trace
  refused.

jointlab's own seeding (``fork_rng`` around compare, checkpoint's RNG replay in
the backward, the snapshot restore) runs outside ``train_fn`` and is untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab.errors import JointlabError, TrainFnMisuseError
from jointlab.trace.checkpoint import records_rng_state
from jointlab.trace.user_calls import CallSite, Judge, refuse_calls

#: (module, function) pairs that seed or set a torch generator's state.
SEED_CALLS: tuple[tuple[Any, str], ...] = (
    *((torch, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.random, n) for n in ("manual_seed", "seed", "set_rng_state")),
    *((torch.cuda, n) for n in ("manual_seed", "manual_seed_all", "seed", "seed_all",
                                "set_rng_state", "set_rng_state_all")),
)

_WHY = ("A seed or generator-state call is Python state: the joint graph cannot replay it, "
        "so every random op after it would draw another stream than eager does, silently.")
_SEED_HOW = ("torch.manual_seed(s); joint.run(model, inputs) before each step, or pass seed=s "
             "to jl.compare / jl.Stepper, which seed eager and the graph alike.")
_SET_STATE = (" mode='make_fx' records torch.set_rng_state as a graph node (as it does for "
              "checkpoint's RNG replay): trace with it where the state is set on purpose.")

Refusal = tuple[type[JointlabError], str]


def _refusal(module: Any, name: str, site: CallSite) -> Refusal:
    call = f"{module.__name__}.{name}()"
    if site.by_user:
        where = f"train_fn calls {call} at {site.line} (in {site.function})."
        fix = f"Seed outside train_fn: {_SEED_HOW}"
    else:
        helper = site.function.rsplit(".", 1)[-1]
        where = (f"train_fn calls {call} through {site.function} (at {site.line}), reached "
                 f"from your line {site.user_line}. Whoever makes it, it has the same effect.")
        fix = (f"Keep {helper} out of train_fn (call what it wraps directly: PyTorch's "
               f"OpInfo wrapper_set_seed only reseeds around its op) and seed outside: "
               f"{_SEED_HOW}")
    return TrainFnMisuseError, f"{where} {_WHY} {fix}" + (
        _SET_STATE if name == "set_rng_state" else "")


def _judge() -> Judge:
    refused: list[Refusal] = []

    def judge(module: Any, name: str, site: CallSite, original: Callable[..., Any],
              _args: tuple, _kwargs: dict) -> Refusal | None:
        if refused:  # the trace already fails: let fork_rng's restore run as it unwinds
            return None
        if name == "set_rng_state" and records_rng_state(original):
            return None  # make_fx: a graph node that sets the state as eager does
        refused.append(_refusal(module, name, site))
        return refused[-1]

    return judge


def _bytes(state: torch.Tensor) -> bytes:
    # The generator hands out a real CPU tensor even under the trace's modes; read its
    # memory directly, since any op on it (numpy() detaches) would be traced or faked.
    return ctypes.string_at(state.data_ptr(), state.untyped_storage().nbytes())


@contextlib.contextmanager
def _state_unchanged(where: str) -> Iterator[None]:
    before = torch.default_generator.get_state()
    seen = _bytes(before)
    yield  # an exception escaping the block is reported as it is
    if _bytes(torch.default_generator.get_state()) != seen:
        torch.default_generator.set_state(before)
        raise TrainFnMisuseError(
            f"torch's default CPU generator was reseeded or had its state set while "
            f"{where} ran, by a call jointlab does not see (e.g. torch.default_generator."
            f"manual_seed(...), or a seeding function bound by name before jl.trace; "
            f"calls through torch.manual_seed / torch.set_rng_state are named with "
            f"their line). {_WHY} Find the call in train_fn or the model's forward and "
            f"take it out; seed outside train_fn: {_SEED_HOW} The generator's state is "
            f"put back.")


@contextlib.contextmanager
def seed_call_refusals(where: str = "train_fn") -> Iterator[None]:
    """Refuse every seed and generator-state call inside this block, whoever makes it.

    Args:
        where: What runs in the block, for the backstop's message.

    Yields:
        Nothing; the originals are back when the block exits, whatever happens.

    Raises:
        TrainFnMisuseError: A call seeded or set the generator (checked at each
            call, and on the default CPU generator's state when the block ends).
    """
    with _state_unchanged(where), refuse_calls(SEED_CALLS, _judge()):
        yield
