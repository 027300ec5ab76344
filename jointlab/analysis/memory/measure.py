"""Measure what one run of a joint graph really allocates, per node step.

The graph runs through :class:`StepInterpreter`, an ``fx.Interpreter`` that
drops values exactly where the generated code does (after their last use,
and right away for values nobody reads) and tells a *sampler* where each
step starts and where its op returns. Two samplers share that driver:

- :class:`ProfilerSampler` (CPU and any device): the profiler's allocation
  events. An allocation freed before the outermost ``aten::`` op that made it
  returns is kernel *workspace*; everything else is a graph value.
- :class:`CudaStatsSampler`: the CUDA caching allocator's counters. Live
  bytes right after the op returns are graph values; the step's high-water
  mark above them is workspace.

Both give, per step: ``measured`` (peak of graph values while the step runs),
``measured_total`` (with workspace) and ``workspace``. The state and inputs
already live when the run starts are counted once, from the real tensors.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from jointlab.analysis.memory.sizes import round_alloc
from jointlab.meta import node_error
from jointlab.torch_compat import allocation_event_tag, free_unused_values, kineto_event_tree

_SCOPE = "jl::step"


class Sampler(Protocol):
    """Collects live bytes around each step of a :class:`StepInterpreter` run."""

    def start_step(self, step: int) -> None:
        """Called before step ``step`` runs (after the previous step's frees)."""

    def op_returned(self, step: int) -> None:
        """Called right after the step's op returned, before any value is dropped."""

    def result(self, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-step (graph-value peak, total peak, workspace peak) in bytes."""


class StepInterpreter(fx.Interpreter):
    """Runs a GraphModule node by node, freeing values like its generated code."""

    def __init__(self, gm: fx.GraphModule, sampler: Sampler) -> None:
        """Wrap ``gm``; ``sampler`` sees every step boundary."""
        super().__init__(gm, garbage_collect_values=True)
        self.sampler = sampler
        self.step_of = {n: i for i, n in enumerate(gm.graph.nodes)}
        free_unused_values(self)

    def run_node(self, node: fx.Node) -> Any:
        """Run one node between sampler calls; name the node in any error."""
        step = self.step_of[node]
        self.sampler.start_step(step)
        try:
            with torch.profiler.record_function(f"{_SCOPE}{step}"):
                out = super().run_node(node)
        except Exception as e:
            raise node_error(node, e, "while measuring memory") from e
        self.sampler.op_returned(step)
        return out


# -- CPU: profiler events ------------------------------------------------------------
def _walk(roots: list[Any]) -> list[Any]:
    out, stack = [], list(roots)
    while stack:
        e = stack.pop()
        out.append(e)
        stack.extend(e.children)
    return out


def _outer_op_end(event: Any) -> int | None:
    """End time of the outermost ``aten::`` op enclosing an allocation event."""
    end, p = None, event.parent
    while p is not None:
        if p.name.startswith("aten::"):
            end = p.end_time_ns
        p = p.parent
    return end


@contextlib.contextmanager
def _quiet_fd2():
    """Silence C-level stderr for the block.

    kineto logs ``USDT: profiler_start/stop`` lines there, which Jupyter
    would show in the notebook.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2 (e.g. some embedded interpreters)
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class ProfilerSampler:
    """Per-step live bytes from ``torch.profiler`` allocation events."""

    def __init__(self) -> None:
        """Create the profiler (entered by :meth:`running`)."""
        # acc_events=True: one cycle either way, and torch before 2.13 warns "Profiler clears
        # events at the end of each cycle" without it (a UserWarning in the notebook).
        self.prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
            acc_events=True)

    def start_step(self, step: int) -> None:
        """Step boundaries come from ``record_function`` scopes."""

    def op_returned(self, step: int) -> None:
        """Nothing to sample: the events carry the times."""

    @contextlib.contextmanager
    def running(self):
        """Profile the block."""
        with _quiet_fd2():
            self.prof.__enter__()
        try:
            yield self
        finally:
            with _quiet_fd2():
                self.prof.__exit__(None, None, None)


    def result(self, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Walk the event tree and fold allocations into per-step peaks."""
        allocation = allocation_event_tag()
        events = _walk(kineto_event_tree(self.prof))
        starts = np.full(n_steps, -1, dtype=np.int64)
        ends = np.full(n_steps, -1, dtype=np.int64)
        allocs = []
        for e in events:
            if e.tag == allocation:
                allocs.append(e)
            elif e.name.startswith(_SCOPE):
                i = int(e.name[len(_SCOPE):])
                starts[i], ends[i] = e.start_time_ns, e.end_time_ns
        allocs.sort(key=lambda e: e.start_time_ns)
        return fold_allocations(allocs, starts, ends)


def _limit(e: Any, starts: np.ndarray, ends: np.ndarray) -> int:
    end = _outer_op_end(e)
    if end is not None:
        return end
    i = int(np.searchsorted(starts, e.start_time_ns, side="right")) - 1
    return int(ends[i]) if i >= 0 else -1


def fold_allocations(allocs: list[Any], starts: np.ndarray, ends: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Running live bytes of chronological allocation events, per step window.

    Args:
        allocs: Allocation events sorted by time (``extra_fields.alloc_size``
            positive for an allocation, negative for a free).
        starts: Start time of each step's scope.
        ends: End time of each step's scope.

    Returns:
        Per step: peak of graph values, peak of everything (both above the
        start) and peak of workspace.
    """
    n = len(starts)
    open_at: dict[int, int] = {}
    workspace = np.zeros(len(allocs), dtype=bool)
    for k, e in enumerate(allocs):
        ptr, size = e.extra_fields.ptr, e.extra_fields.alloc_size
        if size > 0:
            open_at[ptr] = k
            continue
        j = open_at.pop(ptr, None)
        if j is not None and e.start_time_ns <= _limit(allocs[j], starts, ends):
            workspace[j] = workspace[k] = True
    graph = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    ws = np.zeros(n, dtype=np.int64)
    live_g = live_t = 0
    step = 0
    for k, e in enumerate(allocs):
        while step + 1 < n and starts[step + 1] >= 0 and e.start_time_ns >= starts[step + 1]:
            step += 1
            graph[step], total[step], ws[step] = live_g, live_t, live_t - live_g
        size = e.extra_fields.alloc_size
        live_t += size
        if not workspace[k]:
            live_g += size
        graph[step] = max(graph[step], live_g)
        total[step] = max(total[step], live_t)
        ws[step] = max(ws[step], live_t - live_g)
    for s in range(step + 1, n):
        graph[s], total[s], ws[s] = live_g, live_t, live_t - live_g
    return graph, total, ws


# -- CUDA: allocator statistics ---------------------------------------------------------
class CudaStatsSampler:
    """Per-step live bytes from the CUDA caching allocator's counters."""

    def __init__(self, device: torch.device | str) -> None:
        """Sample ``device`` (a CUDA device)."""
        self.device = torch.device(device)
        self.graph: dict[int, int] = {}
        self.total: dict[int, int] = {}
        self.base = 0

    @contextlib.contextmanager
    def running(self):
        """Record allocations relative to what is live when the block starts."""
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        yield self
        torch.cuda.synchronize(self.device)

    def start_step(self, step: int) -> None:
        """Reset the high-water mark; what is live now is the previous step's end."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def op_returned(self, step: int) -> None:
        """Read graph values (live now) and the step's high-water mark."""
        torch.cuda.synchronize(self.device)
        self.graph[step] = torch.cuda.memory_allocated(self.device) - self.base
        self.total[step] = torch.cuda.max_memory_allocated(self.device) - self.base

    def result(self, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-step peaks (steps that did not run carry the previous value)."""
        graph = carry_forward(self.graph, n_steps)
        total = carry_forward(self.total, n_steps)
        return graph, total, total - graph


def carry_forward(samples: dict[int, int], n_steps: int) -> np.ndarray:
    """Dense per-step array from sparse samples, carrying the last value forward."""
    out = np.zeros(n_steps, dtype=np.int64)
    last = 0
    for i in range(n_steps):
        last = samples.get(i, last)
        out[i] = last
    return out


# -- driver -------------------------------------------------------------------------------
def live_at_start(args: list[Any], gm: fx.GraphModule, device: str) -> int:
    """Bytes of the distinct storages of the graph's args and constants.

    Args:
        args: The graph's positional args.
        gm: The graph module (its tensor constants count too).
        device: Allocator whose rounding to apply.

    Returns:
        Bytes already live when the run starts.
    """
    seen: dict[int, int] = {}
    consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    for t in [*args, *consts]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            seen[s.data_ptr()] = round_alloc(s.nbytes(), device)
    return sum(seen.values())


@contextlib.contextmanager
def _preserved(model: nn.Module):
    """Restore the model's buffers and the RNG after a measuring run."""
    saved = {k: b.detach().clone() for k, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            with torch.no_grad():
                for k, b in model.named_buffers():
                    b.copy_(saved[k])


def measure(joint: Any, model: nn.Module, inputs: dict[str, Any], device: str = "cpu"
            ) -> pd.DataFrame:
    """Run the joint graph once and record live bytes per step.

    The model's buffers and the global RNG are left as they were.

    Args:
        joint: The JointGraph.
        model: The live model.
        inputs: Inputs with the traced structure.
        device: ``cpu`` (profiler events) or ``cuda`` (allocator counters).

    Returns:
        One row per node step: ``measured``, ``measured_total``, ``workspace``.
    """
    gm = joint.graph_module
    flat = joint.flat_args(model, inputs)
    dev = torch.device(device)
    flat = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in flat]
    with _preserved(model), torch.no_grad():
        return measure_graph(gm, joint.runtime.prepare(joint, flat), device)


def measure_graph(gm: fx.GraphModule, args: list[Any], device: str = "cpu") -> pd.DataFrame:
    """Run ``gm(*args)`` node by node and record live bytes per step.

    Args:
        gm: Any GraphModule.
        args: Its positional args (real tensors on ``device``).
        device: ``cpu`` (profiler events) or ``cuda`` (allocator counters).

    Returns:
        One row per node step: ``measured``, ``measured_total``, ``workspace``.
    """
    dev = torch.device(device)
    sampler: Any = CudaStatsSampler(dev) if dev.type == "cuda" else ProfilerSampler()
    base = live_at_start(args, gm, device)
    with torch.no_grad(), sampler.running():
        out = StepInterpreter(gm, sampler).run(*args)
        del out
    graph, total, ws = sampler.result(len(gm.graph.nodes))
    return pd.DataFrame({"measured": graph + base, "measured_total": total + base,
                         "workspace": ws})
