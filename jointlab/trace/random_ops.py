"""Random ops in a joint graph: why they draw what eager draws, and what is refused.

Both tracing modes record the ATen random op that eager dispatches (make_fx
records ``bernoulli_``, ``normal``, ``rrelu_with_noise``, ``randperm``, ...
as they are; AOT records their functional forms, which call the same
kernels, save for the layout exception below), and nothing decomposes them:
jointlab passes no decomposition table. Running the graph therefore consumes
the default generator in the same order and with the same kernels as eager,
so every op tagged
``torch.Tag.nondeterministic_seeded`` draws bit for bit the same numbers from
the same seed (checked op by op in ``tests/test_random_ops.py``), and the
Stepper runs exactly those nodes in its own stream
(:func:`jointlab.meta.draws_random`).

What cannot be made exact is refused while tracing:

* an explicit ``torch.Generator`` passed to an op (``torch.randn(...,
  generator=g)``): the graph would hold that generator, shared with the user,
  which neither ``Stepper(seed=...)`` nor ``jl.compare`` can seed or isolate;
* ``Tensor.random_(from, to)``: its overload is named ``from``, a Python
  keyword, and torch's FX code generator cannot emit it (a ``SyntaxError``
  inside make_fx). ``torch.randint_like`` and ``random_(to)`` draw the same
  numbers through other overloads;
* in AOT mode, a draw whose functional form lays its numbers out differently
  from eager's kernel: ``x.bernoulli_(p)`` and ``rrelu`` in training on a
  non-contiguous ``x``. Eager's in-place ``bernoulli_`` fills ``x`` in its own
  memory order, while AOT records ``bernoulli.p``, which fills a fresh
  contiguous tensor (and a user's ``torch.bernoulli(x, p)`` records the same
  node, so the graph cannot tell which was meant); eager's ``rrelu`` returns a
  contiguous result where its functional form keeps ``x``'s strides, so a
  dropout after it draws its mask in another order. make_fx mode records
  eager's own ops and is exact for both (``tests/test_random_ops.py`` checks
  every other in-place draw on a non-contiguous tensor in both modes).
"""

from __future__ import annotations

import contextlib
import traceback
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab import torch_compat
from jointlab.errors import UnsupportedRandomOpError
from jointlab.sources import at_user_line, user_source

__all__ = ["draws_from_generator", "random_op_refusals", "refuse_explicit_generators",
           "refuse_layout_dependent_draws"]

_KEYWORD_OVERLOADS = ("random_.from", "random.from")


def _generator_value(gm: fx.GraphModule, arg: Any) -> torch.Generator | None:
    if isinstance(arg, torch.Generator):
        return arg
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        value = getattr(gm, str(arg.target), None)
        return value if isinstance(value, torch.Generator) else None
    return None


def draws_from_generator(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True when ``node`` is passed an explicit ``torch.Generator`` (not the default one)."""
    if node.op != "call_function":
        return False
    args = list(node.args) + list(node.kwargs.values())
    return any(_generator_value(gm, a) is not None for a in args)


def _where(node: fx.Node) -> str:
    source = _meta.info(node).get("source") or user_source(node.meta.get("stack_trace"))
    return f"at {source}" if source else "at an unknown source line"


_EXPLICIT_GENERATOR = (
    "draws from an explicit torch.Generator (generator=...). A joint graph would share that "
    "generator with your code, and jl.Stepper(seed=...) and jl.compare can seed only the "
    "default one, so their results would not be reproducible. Drop generator= and seed the "
    "default generator with torch.manual_seed(seed) before the step.")


def refuse_explicit_generators(gm: fx.GraphModule) -> None:
    """Raise when an op of the traced graph draws from a user-supplied generator.

    Raises:
        UnsupportedRandomOpError: Names the op and the user's source line.
    """
    for node in gm.graph.nodes:
        if draws_from_generator(gm, node):
            raise UnsupportedRandomOpError(f"{node.target} {_where(node)} {_EXPLICIT_GENERATOR}")


#: AOT's nodes whose draw order on a non-contiguous input can differ from eager's kernel
_LAYOUT_DEPENDENT = ("aten.bernoulli.p", "aten.rrelu_with_noise_functional.default")


def _draws_in_another_order(node: fx.Node) -> bool:
    if node.op != "call_function" or str(node.target) not in _LAYOUT_DEPENDENT:
        return False
    first = node.args[0] if node.args else None
    val = first.meta.get("val") if isinstance(first, fx.Node) else None
    return isinstance(val, torch.Tensor) and not val.is_contiguous()


def refuse_layout_dependent_draws(gm: fx.GraphModule) -> None:
    """Raise when an AOT graph draws on a non-contiguous tensor in an order eager may not.

    Raises:
        UnsupportedRandomOpError: Names the op, the user's source line and both fixes.
    """
    for node in gm.graph.nodes:
        if _draws_in_another_order(node):
            op = "bernoulli_" if "bernoulli" in str(node.target) else "rrelu (training)"
            raise UnsupportedRandomOpError(
                f"{op} on a non-contiguous tensor {_where(node)}: AOT mode records its "
                f"functional form ({node.target}), which can lay the random numbers out in "
                "another memory order than eager's kernel, so the graph would draw other "
                "numbers from the same seed. Make the tensor contiguous first "
                "(x.contiguous()), or trace with mode='make_fx', which records eager's own "
                "op and draws exactly what eager draws.")


def _keyword_overload_source(tb: types.TracebackType | None) -> str:
    while tb is not None:  # make_fx's dispatch_trace holds the traced graph
        graph = tb.tb_frame.f_locals.get("graph")
        if isinstance(graph, fx.Graph):
            for node in graph.nodes:
                if str(node.target).endswith(_KEYWORD_OVERLOADS):
                    return _where(node)
        tb = tb.tb_next
    return "at an unknown source line"


@contextlib.contextmanager
def random_op_refusals() -> Iterator[None]:
    """Turn torch's failures on ``random_(from, to)`` and on a generator into clear refusals.

    Raises:
        UnsupportedRandomOpError: The traced code calls ``Tensor.random_(from, to)``, or
            (torch 2.11/2.12) passes an explicit ``torch.Generator`` to an op.
    """
    try:
        yield
    except NotImplementedError as exc:
        if not torch_compat.is_generator_argument_error(exc):
            raise
        line = at_user_line(traceback.extract_tb(exc.__traceback__))
        raise UnsupportedRandomOpError(
            f"a random op{line or ' at an unknown source line'} {_EXPLICIT_GENERATOR}") from exc
    except SyntaxError as exc:
        if not any(f".{o.split('.')[1]}(" in (exc.text or "") for o in _KEYWORD_OVERLOADS):
            raise
        raise UnsupportedRandomOpError(
            f"Tensor.random_(from, to) {_keyword_overload_source(exc.__traceback__)} cannot be "
            "traced: its ATen overload is named 'from', a Python keyword, which torch's FX "
            "code generator cannot emit. torch.randint_like(x, from, to) draws the same "
            "numbers (x.random_(to) too, when from is 0); use one of those.") from exc
