"""AOT autograd's private pieces: the joint export, its descriptors, the partitioners.

Callers name none of torch's private modules; each accessor imports its
module on first call and raises :func:`~jointlab.torch_compat.unsupported`'s
error naming the API when this torch lacks it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from jointlab.torch_compat._base import torch_attr, torch_module

_DESCRIPTORS = "torch._functorch._aot_autograd.descriptors"
_PARTITIONERS = "torch._functorch.partitioners"


def aot_descriptors() -> ModuleType:
    """AOT export's descriptor classes (``ParamAOTInput``, ``GradAOTOutput``...)."""
    return torch_module(_DESCRIPTORS, "read AOT descriptors")


def aot_export_joint() -> Callable[..., Any]:
    """``aot_export_joint_with_descriptors``: the joint export of ``mode="aot"``."""
    return torch_attr("torch._functorch.aot_autograd", "aot_export_joint_with_descriptors",
                      "export the joint graph in mode='aot'")


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
