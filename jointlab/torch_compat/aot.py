"""AOT autograd's private pieces: the joint export, its descriptors, the partitioners.

Callers name none of torch's private modules; each accessor imports its
module on first call and raises :func:`~jointlab.torch_compat.unsupported`'s
error naming the API when this torch lacks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch

from jointlab.torch_compat._base import release, torch_attr, torch_module

#: From torch 2.13 on, AOT's joint export tags each backward node with
#: ``meta["autograd_backward"]`` (and the gradient-accumulation adds it marks
#: ``is_gradient_acc`` with it); before, :func:`aot_backward_marks` adds the tags.
MARKS_ENGINE_BACKWARD_IN_AOT = release(torch.__version__) >= (2, 13, 0)

_DESCRIPTORS = "torch._functorch._aot_autograd.descriptors"
_PARTITIONERS = "torch._functorch.partitioners"


def aot_descriptors() -> ModuleType:
    """AOT export's descriptor classes (``ParamAOTInput``, ``GradAOTOutput``...)."""
    return torch_module(_DESCRIPTORS, "read AOT descriptors")


def aot_export_joint() -> Callable[..., Any]:
    """``aot_export_joint_with_descriptors``: the joint export of ``mode="aot"``."""
    return torch_attr("torch._functorch.aot_autograd", "aot_export_joint_with_descriptors",
                      "export the joint graph in mode='aot'")


def aot_backward_marks() -> contextlib.AbstractContextManager[Any]:
    """A context under which the AOT export tags its backward nodes as 2.13's does.

    torch 2.13 and newer tag them themselves (the context only clears torch's
    callback flag a failed export would leave set); on 2.11 and
    2.12 :func:`jointlab.torch_compat.backport.patch_aot_backward_marks` rebuilds
    the tags, without which no backward node would find its forward twin.

    Returns:
        The context to hold while ``aot_export_joint_with_descriptors`` traces.
    """
    if MARKS_ENGINE_BACKWARD_IN_AOT:  # torch tags them; a failed export must not leak
        from jointlab.torch_compat.graphs import backward_callback_flag_cleared

        return backward_callback_flag_cleared()
    from jointlab.torch_compat import backport

    return backport.patch_aot_backward_marks()


class Partitioners(NamedTuple):
    """torch's joint-graph partitioners and the functorch config that steers them."""

    default_partition: Callable[..., Any]
    min_cut_rematerialization_partition: Callable[..., Any]
    config: ModuleType


def partitioners() -> Partitioners:
    """The partitioners that split a joint graph into forward and backward."""
    why = "score what-if partitions"
    return Partitioners(torch_attr(_PARTITIONERS, "default_partition", why),
                        torch_attr(_PARTITIONERS, "min_cut_rematerialization_partition", why),
                        torch_module("torch._functorch.config", why))
