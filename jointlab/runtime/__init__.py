"""The runtime layer: what running or loading a traced graph needs, without the tracer.

Below :mod:`jointlab.trace`, :mod:`jointlab.analysis` and :mod:`jointlab.io`:

- :mod:`~jointlab.runtime.plans`: the :class:`Runtime` protocol, :class:`MakeFxRuntime`
  and :class:`AotRuntime` (how each mode's graph takes jointlab's flat layout).
- :mod:`~jointlab.runtime.dtensor`: DTensor state as local shards, :class:`DTensorRuntime`
  and its AOT form, rank classes.
- :mod:`~jointlab.runtime.custom_ops`: jointlab's own ops a graph may hold (the
  checkpoint RNG-state ops, the oneDNN RNN layer).
- :mod:`~jointlab.runtime.fakes`: fake-tensor creation (symbolic fake modes, ``jl.fake_cpu``).
- :mod:`~jointlab.runtime.torch_errors`: torch's errors while running as jointlab errors.
- :mod:`~jointlab.runtime.graph`: :class:`RunnableGraph`, the plain traced-graph object.
"""

from __future__ import annotations

from jointlab.runtime.plans import AotRuntime, MakeFxRuntime, Runtime

__all__ = ["AotRuntime", "MakeFxRuntime", "Runtime"]
