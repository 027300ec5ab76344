"""The models, plans and step a real job and the fake world both trace (one source, one line).

``tp``: tensor parallel (``ColwiseParallel`` then ``RowwiseParallel``) over every rank;
every rank's graph is the same. ``uneven``: SimpleFSDP-style all-gather of parameters
sharded ``Shard(0)`` over ranks, with 3 rows over 2 ranks (2 and 1), so the ranks' graphs
differ in their local shapes. Both build from the same seed on every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("tp", "uneven")
#: (kind, tracing mode) pairs a real job traces.
CASES = tuple((kind, mode) for kind in KINDS for mode in ("make_fx", "aot"))


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One training step's loss."""
    return F.mse_loss(model(x), y)


def inputs() -> dict[str, torch.Tensor]:
    """The same inputs on every rank (own generator: the global RNG is left alone)."""
    gen = torch.Generator().manual_seed(1)
    return {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}


class _Gather(nn.Module):
    """All-gather a Shard(0) parameter in forward; reduce-scatter (avg) its gradient."""

    def __init__(self, mesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, p):
        from torch.distributed.tensor import Partial, Replicate

        return p.redistribute(self.mesh, [Replicate()]).to_local(grad_placements=[Partial("avg")])


def reference(kind: str) -> nn.Module:
    """The unsharded model (seeded, so every process builds the same one)."""
    torch.manual_seed(0)
    hidden = 32 if kind == "tp" else 3
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 16))


def simple_fsdp(model: nn.Module, mesh) -> nn.Module:
    """SimpleFSDP in place: every parameter ``Shard(0)`` over ``mesh``, gathered by ``_Gather``."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.nn.utils import parametrize

    for mod in list(model.modules()):
        for name, p in list(mod.named_parameters(recurse=False)):
            mod.register_parameter(name, nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
            parametrize.register_parametrization(mod, name, _Gather(mesh), unsafe=True)
    return model


def sharded(kind: str, mesh) -> nn.Module:
    """``reference(kind)`` sharded over ``mesh`` (1-D) by the kind's plan."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = reference(kind)
    if kind == "tp":
        return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return simple_fsdp(model, mesh)
