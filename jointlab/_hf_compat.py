"""Compatibility shim: let transformers see that the AOT export is tracing.

transformers guards its data-dependent shortcuts (``masking_utils``: "skip
the mask when nothing is padded", "no packed sequences") with
``transformers.utils.import_utils.is_tracing(tensor)``, which recognises a
``FakeTensor`` (what make_fx mode hands the model) but not the
``FunctionalTensor`` that the AOT export wraps around it. In mode="aot" those
branches then read tensor values and the export fails with a data-dependent
error.

:func:`hf_tracing_compat` fixes only that recognition, and only while the AOT
export runs: every ``is_fake_tensor`` function that transformers' loaded
modules hold (``is_tracing`` looks it up in ``import_utils`` at call time) is
replaced by one that also accepts a ``FunctionalTensor`` whose inner tensor is
a ``FakeTensor``. The originals are put back when the block exits, whatever
happens. This makes transformers take the same branch as in make_fx mode (the
one it takes under ``torch.compile``), whose result equals eager's.

transformers is never imported here: if the user has not imported it, the
shim does nothing, so ``import jointlab`` stays light and other models are
untouched.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

_IMPORT_UTILS = "transformers.utils.import_utils"
_NAME = "is_fake_tensor"


def _functional_tensor_type() -> type | None:
    try:
        from torch._subclasses.functional_tensor import FunctionalTensor
    except ImportError:  # pragma: no cover - a torch without the AOT functional tensor
        return None
    return FunctionalTensor


def is_functional_fake(x: Any) -> bool:
    """True when ``x`` is a ``FunctionalTensor`` wrapping a ``FakeTensor`` (AOT tracing).

    Args:
        x: Any value.

    Returns:
        Whether ``x`` is one of the AOT export's tracing tensors.
    """
    functional = _functional_tensor_type()
    unwrap = getattr(torch, "_from_functional_tensor", None)
    if functional is None or unwrap is None or not isinstance(x, functional):
        return False
    inner = unwrap(x.elem)
    return isinstance(inner, torch._subclasses.FakeTensor)


def _holders(original: Callable[..., Any]) -> list[Any]:
    """transformers' loaded modules that hold ``original`` under its own name."""
    return [mod for name, mod in list(sys.modules.items())
            if (name == "transformers" or name.startswith("transformers."))
            and mod is not None and mod.__dict__.get(_NAME) is original]


@contextlib.contextmanager
def hf_tracing_compat() -> Iterator[None]:
    """Make transformers' ``is_tracing`` recognise the AOT export's tensors in this block.

    Does nothing unless transformers is already imported and has the function.

    Yields:
        Nothing; the patch is active inside the block and removed on exit.
    """
    utils = sys.modules.get(_IMPORT_UTILS)
    original = getattr(utils, _NAME, None) if utils is not None else None
    if not callable(original):
        yield
        return

    def is_fake_tensor(x: Any) -> bool:
        return bool(original(x)) or is_functional_fake(x)

    is_fake_tensor.__wrapped__ = original  # type: ignore[attr-defined]
    holders = _holders(original)
    try:
        for mod in holders:
            setattr(mod, _NAME, is_fake_tensor)
        yield
    finally:
        for mod in holders:
            setattr(mod, _NAME, original)
