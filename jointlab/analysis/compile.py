"""``JointGraph.compile``: run the joint graph through ``torch.compile``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from jointlab.core import TracedGraph as JointGraph


# Inductor replaces random ops by its own generator unless told to call the ATen
# ones: with fallback_random the compiled graph draws what eager draws.
_EXACT_RANDOM = {"fallback_random": True}


# -- compiled execution ----------------------------------------------------------
class CompiledJoint:
    """A joint graph whose :meth:`run` goes through ``torch.compile``."""

    def __init__(self, joint: JointGraph, backend: str) -> None:
        """Wrap ``joint``; compilation happens on the first :meth:`run`."""
        self.joint = joint
        self.backend = backend
        self.compiled = torch.compile(joint.graph_module, backend=backend,
                                      options=_EXACT_RANDOM if backend == "inductor" else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.joint, name)

    def run(self, model: nn.Module, inputs: dict[str, Any], *, accumulate: bool = False):
        """Run one step like :meth:`JointGraph.run`, through the compiled graph."""
        return self.joint.run_with(self.compiled, model, inputs, accumulate=accumulate)

    def __repr__(self) -> str:
        """Name the backend."""
        return f"CompiledJoint(backend={self.backend!r}, {self.joint!r})"


def compile_joint(joint: JointGraph, backend: str = "inductor") -> CompiledJoint:
    """Compile ``joint`` with ``torch.compile``.

    Args:
        joint: The joint graph.
        backend: A ``torch.compile`` backend name (``"inductor"``, ``"aot_eager"``, ...).

    Returns:
        An object with the same ``run(model, inputs)`` as the JointGraph.
    """
    return CompiledJoint(joint, backend)
