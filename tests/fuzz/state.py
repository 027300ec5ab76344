"""A deep, bitwise snapshot of a model, to prove that jointlab did not change it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _copy(t: torch.Tensor | None) -> Any:
    return None if t is None else (t.dtype, t.device, t.detach().clone())


def deep_state(model: nn.Module) -> dict[str, Any]:
    """Values, grads, requires_grad, identities, types and flags of every tensor and module."""
    return {
        "params": [(n, id(p), type(p), p.requires_grad, _copy(p), _copy(p.grad))
                   for n, p in model.named_parameters(remove_duplicate=False)],
        "buffers": [(n, id(b), _copy(b)) for n, b in model.named_buffers(remove_duplicate=False)],
        "modules": [(n, id(m), m.training, sorted(m._parameters), sorted(m._buffers))
                    for n, m in model.named_modules(remove_duplicate=False)],
        "rng": torch.get_rng_state(),
    }


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.device.type == "meta" or b.device.type == "meta":  # no data to compare
            return (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
        return a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                  and torch.equal(a.nan_to_num(), b.nan_to_num())))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def assert_unchanged(before: dict[str, Any], model: nn.Module) -> None:
    """Fail with the first differing entry if ``model`` differs from ``before``."""
    after = deep_state(model)
    for key in before:
        a, b = before[key], after[key]
        if key == "rng":
            assert torch.equal(a, b), "the global RNG state changed"
            continue
        assert len(a) == len(b), f"{key}: {len(a)} entries before, {len(b)} after"
        for x, y in zip(a, b):
            assert _equal(x, y), f"{key} changed: {x[0]!r}"
