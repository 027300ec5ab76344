"""Fake tensors: symbolic fake modes, :func:`fakeify`, and meta models as CPU fakes.

:func:`symbolic_fake_mode` and :func:`fakeify` make the fakes a trace runs on
(the dims of a dynamic trace symbolic); :func:`symbolic_dispatch` is the Python
dispatcher such a trace needs.

On the meta device ``F.scaled_dot_product_attention`` decomposes into the
math path (see :mod:`jointlab.trace.meta_attention`). Inside :func:`fake_cpu`,
``jl.trace`` (``mode="make_fx"``) makes the fakes of a meta model's
parameters, buffers and inputs report the CPU device (their data stays on
meta, nothing is allocated), so torch picks the CPU fused attention kernel::

    with torch.device("meta"):
        model = build()
    with jl.fake_cpu():
        joint = jl.trace(model, train_fn, inputs)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from jointlab import torch_compat
from jointlab.errors import UnsupportedTorchError

if TYPE_CHECKING:
    from jointlab.torch_compat import FakeTensorMode

_STATE = {"active": False}


@contextlib.contextmanager
def fake_cpu() -> Iterator[None]:
    """Trace meta tensors as CPU fakes (make_fx mode), so SDPA picks its fused kernel.

    Yields:
        Nothing; ``jl.trace`` calls inside the block use CPU-device fakes.
    """
    prev, _STATE["active"] = _STATE["active"], True
    try:
        yield
    finally:
        _STATE["active"] = prev


def wants_cpu_fake(t: torch.Tensor) -> bool:
    """True when ``t`` lives on meta and :func:`fake_cpu` is active."""
    return _STATE["active"] and t.device.type == "meta"


def cpu_fake(mode: Any, t: torch.Tensor) -> torch.Tensor:
    """A fake of the meta tensor ``t`` that reports the CPU device (no data allocated).

    Raises:
        UnsupportedTorchError: This torch's ``FakeTensor`` cannot be built this way.
    """
    try:
        from jointlab.torch_compat import FakeTensor

        fake = FakeTensor(mode, t.detach(), torch.device("cpu"))
        return fake.requires_grad_(t.requires_grad)
    except (ImportError, TypeError) as exc:
        raise UnsupportedTorchError(
            f"jl.fake_cpu needs torch._subclasses.fake_tensor.FakeTensor(mode, meta, device), "
            f"which torch {torch.__version__} does not offer; trace on meta without "
            "fake_cpu (attention is then predicted on the math path)."
        ) from exc


def symbolic_fake_mode(checking: bool = False) -> FakeTensorMode:
    """A fake mode with a fresh shape environment for a dynamic trace.

    Args:
        checking: Make it a ``torch_compat.checking_fake_mode`` (make_fx's write check).
    """
    make = torch_compat.checking_fake_mode if checking else torch_compat.FakeTensorMode
    return make(allow_non_fake_inputs=True, shape_env=torch_compat.ShapeEnv())


def symbolic_dispatch(dynamic: bool) -> contextlib.AbstractContextManager[Any]:
    """The Python dispatcher, which a make_fx trace with symbolic sizes needs.

    make_fx enables it itself only with ``tracing_mode="symbolic"``; jointlab
    hands it fake tensors from its own shape environment instead, so without
    this the C++ kernels of composite ops (``F.pad`` in transformers' causal-LM
    loss) read concrete sizes and specialize every dynamic dim they touch.

    Args:
        dynamic: Whether the trace has symbolic dims (otherwise a no-op).

    Returns:
        A context manager to hold around the trace.

    Raises:
        UnsupportedTorchError: The trace is dynamic and this torch lacks the dispatcher.
    """
    if not dynamic:
        return contextlib.nullcontext()
    return torch_compat.enable_python_dispatcher()  # resolved (and checked) on first use


def fakeify(mode: FakeTensorMode, t: torch.Tensor, dyn: set[int] | None) -> torch.Tensor:
    """Make a fake tensor, with the dims in ``dyn`` symbolic."""
    if wants_cpu_fake(t) and not dyn:  # jl.fake_cpu(): a meta tensor faked as CPU
        return cpu_fake(mode, t)
    if not dyn or mode.shape_env is None:
        return mode.from_tensor(t, static_shapes=True)
    dim_dynamic = torch_compat.DimDynamic
    sizes = [dim_dynamic.DYNAMIC if d in dyn else dim_dynamic.STATIC for d in range(t.dim())]
    ctx = torch_compat.StatelessSymbolicContext(dynamic_sizes=sizes)
    return mode.from_tensor(t, symbolic_context=ctx)
