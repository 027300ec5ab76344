"""What ``train_fn`` returns: the loss (checked) and the ``loss_dict``.

The tracer checks and splits it while tracing; the eager references of
:func:`jointlab.compare` and :func:`jointlab.run_all_ranks` split it the same
way when they call ``train_fn`` themselves.
"""

from __future__ import annotations

from typing import Any

import torch

from jointlab.errors import LossError

__all__ = ["check_loss", "split_loss"]


def check_loss(loss: Any) -> None:
    """Raise :class:`LossError` unless ``loss`` is a differentiable one-element tensor."""
    if not isinstance(loss, torch.Tensor):
        raise LossError(
            f"train_fn returned a {type(loss).__name__} as the loss; it must return a scalar "
            "tensor (or (loss, loss_dict)). Return the tensor itself, not .item() or a float."
        )
    if loss.numel() != 1:
        raise LossError(
            f"train_fn returned a loss of shape {list(loss.shape)}; it must be a scalar. "
            "Reduce it, e.g. loss.mean() or loss.sum()."
        )
    if not loss.requires_grad:
        raise LossError(
            "train_fn returned a loss that does not require grad: it does not depend on any "
            "trainable parameter (was it detached, or computed under torch.no_grad()?)."
        )


def split_loss(out: Any) -> tuple[Any, dict[str, Any]]:
    """Split ``train_fn``'s result into the loss and the ``loss_dict``."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out[0], dict(out[1])
    return out, {}
