"""Distributed models: wrappers jointlab cannot trace are refused before tracing.

FSDP2's ``fully_shard`` swaps parameters between sharded and unsharded
storages in forward/backward hooks, outside autograd. A make_fx trace of it
"succeeds" with a fraction of the backward and its graph can crash the
process when run, so it is refused with the routes that work: DTensor
parameters (``parallelize_module`` tensor parallelism, or a SimpleFSDP-style
parametrisation whose all-gathers are ordinary ops in the forward).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from jointlab.errors import UnsupportedWrapperError


def _fsdp_module_class() -> Any:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 (or without distributed): nothing to refuse
        return None
    return FSDPModule


def _fsdp1_class() -> Any:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return None
    return FullyShardedDataParallel


def refuse_unsupported_wrappers(model: nn.Module) -> None:
    """Raise :class:`UnsupportedWrapperError` for FSDP-wrapped modules in ``model``.

    Args:
        model: The model about to be traced (not changed).

    Raises:
        UnsupportedWrapperError: A module is ``fully_shard``-ed (FSDP2) or FSDP1-wrapped.
    """
    kinds = [(c, what) for c, what in ((_fsdp_module_class(), "FSDP2 fully_shard"),
                                       (_fsdp1_class(), "FSDP1 FullyShardedDataParallel"))
             if c is not None]
    for name, mod in model.named_modules():
        for cls, what in kinds:
            if isinstance(mod, cls):
                raise UnsupportedWrapperError(
                    f"module '{name or '<root>'}' ({type(mod).__name__}) is wrapped by {what}, "
                    "which reshards parameters in hooks outside autograd, so its joint graph "
                    "would miss most of the backward. Trace the model before sharding it, or "
                    "shard with DTensor parameters instead: tensor parallelism with "
                    "torch.distributed.tensor.parallel.parallelize_module, or a "
                    "SimpleFSDP-style parametrisation (all-gathers as ops in the forward), "
                    "inside jl.fake_world(...).")
