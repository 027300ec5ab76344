"""Tracing meta models on CPU fakes: :func:`fake_cpu`.

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
from typing import Any

import torch

from jointlab.errors import UnsupportedTorchError

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
