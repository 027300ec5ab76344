"""The node runner under the Stepper and ``compare``: a joint graph bound to a model's state.

:class:`NodeRunner` is an ``fx.Interpreter`` that binds the model's state and
the inputs on one device (cloning the buffers, so the graph's in-place
updates never reach the user's model) and runs the graph's nodes in order,
one at a time (:meth:`NodeRunner.step_node`) or up to an index
(:meth:`NodeRunner.advance`). It only extends the Interpreter through its
public hook, ``run_node``: placeholders read the bound arguments by position,
so nothing drives the Interpreter's private argument iterator.

Ranges of nodes run through generated code (one small GraphModule per range,
built once per runner); a run from the first node to the last with nothing
kept calls the GraphModule itself, so it costs what ``joint.run`` costs.
Values are freed after their last use, as the GraphModule frees them, unless
``keep`` asks otherwise. When the output node has run, the mode's runtime
turns the outputs into the result exactly once (in AOT mode that is also when
the buffer updates land), so reading the result never changes state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab.analysis.step.rng import StepRng, retarget
from jointlab.core import RunResult, TracedGraph
from jointlab.errors import NodeExecutionError, ValueNotAvailableError
from jointlab.meta import draws_random, node_error
from jointlab.passes.analyze import written_in_place
from jointlab.runtime.plans import run_result

__all__ = ["NodeRunner", "check_call", "resolve_device"]

_FAST_MIN_NODES = 16  # below this, stepping node by node is cheaper than codegen

Segment = tuple[Callable[..., Any], list[fx.Node], list[fx.Node]]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, or ``"cuda"`` when available, else ``"cpu"``."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def check_call(joint: Any, model: Any, inputs: Any, error: type[Exception], where: str) -> None:
    """Refuse a graph, model or inputs of the wrong kind before anything runs.

    Args:
        joint: Should be a traced joint graph.
        model: Should be the ``nn.Module`` that was traced.
        inputs: Should be the dict of keyword inputs for ``train_fn``.
        error: The jointlab error class to raise.
        where: The public call, e.g. ``"jl.Stepper"``.

    Raises:
        error: One of them is of the wrong kind (the message says which).
    """
    if not (hasattr(joint, "graph_module") and hasattr(joint, "flat_args")):
        raise error(f"{where} needs the joint graph from jl.trace(...) as its first argument, "
                    f"got {type(joint).__name__}")
    if not isinstance(model, nn.Module):
        raise error(f"{where}: model must be the traced torch.nn.Module (or one with the same "
                    f"parameters and buffers), got {type(model).__name__}")
    if not isinstance(inputs, Mapping):
        raise error(f"{where}: inputs must be the dict of keyword inputs for train_fn, as "
                    f"given to jl.trace, got {type(inputs).__name__}")


def _clone_tensor(value: Any) -> Any:
    """A copy of a tensor value (other values as they are)."""
    return value.clone() if isinstance(value, torch.Tensor) else value


class ValueRecorder(fx.Interpreter):
    """An FX interpreter that keeps a copy of every node's value, by node name.

    Attributes:
        values: ``{node name: value}`` (tensors cloned as produced, so a later
            in-place op does not change them), filled by :meth:`run`.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        """Interpret ``gm``; nothing runs until :meth:`run`."""
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        """Run one node as :class:`torch.fx.Interpreter` does, and record its value."""
        out = super().run_node(n)
        self.values[n.name] = _clone_tensor(out)
        return out


class NodeRunner(fx.Interpreter):
    """Run a joint graph's nodes in order on a private copy of the model's buffers.

    Attributes:
        joint: The traced graph.
        device: Where the nodes run.
        nodes: The graph's nodes in order.
        position: Index in :attr:`nodes` of the next node to run.
        snapshots: Copies of kept values that a later in-place op overwrites.
        result: The run's :class:`jointlab.core.RunResult` once the output node ran.
    """

    def __init__(self, joint: TracedGraph, model: nn.Module, inputs: dict[str, Any], *,
                 device: str | torch.device | None = None, seed: int | None = None,
                 keep: str | Iterable[str] | None = None,
                 settle: Mapping[str, str] | None = None) -> None:
        """Bind ``model``'s state and ``inputs`` to the graph on ``device``.

        Args:
            joint: The traced joint graph.
            model: The model (its buffers are cloned; the model is never changed).
            inputs: Keyword inputs with the traced structure.
            device: Where to run (see :func:`resolve_device`).
            seed: Start the graph's RNG stream from this seed (and again on :meth:`reset`).
            keep: ``"all"`` or node names whose values outlive their last use.
            settle: ``{kept node name: writer node name}``: read that kept node as
                it is once the writer (a later in-place write to its storage) ran,
                not as produced (a module output filled in place, as it returned).
        """
        self.device = resolve_device(device)
        gm = joint.graph_module
        traced_on = set(joint.state_spec.devices)
        if traced_on and traced_on != {self.device}:
            gm = retarget(gm, self.device)
        super().__init__(gm, garbage_collect_values=False)
        self.joint = joint
        self.keep_all = keep == "all"
        self.keep = set() if keep is None or self.keep_all else set(keep)
        self.nodes: list[fx.Node] = list(self.graph.nodes)
        self._placeholder_index = {n: i for i, n in enumerate(self.nodes)
                                   if n.op == "placeholder"}
        self._snap = self._snapshot_plan(settle or {})
        self._bind(joint.flat_args(model, inputs))
        self._rng = StepRng(seed, self.device)
        self._segments: dict[tuple[int, int], Segment] = {}
        self.reset()

    def _bind(self, flat: list[torch.Tensor]) -> None:
        flat = [t.to(self.device) for t in flat]
        spec = self.joint.state_spec
        self._buffer_names = [f for f, p in zip(spec.fqns, spec.is_param) if not p]
        n_state = self.joint.num_state_inputs
        self._n_params = n_state - len(self._buffer_names)
        self._buffer_origin = [t.clone() for t in flat[self._n_params:n_state]]
        flat[self._n_params:n_state] = [t.clone() for t in self._buffer_origin]
        self._flat = flat

    # -- state ------------------------------------------------------------------
    def reset(self) -> None:
        """Go back to the first node: drop values, restore buffers, reseed."""
        with torch.no_grad():
            for i, orig in enumerate(self._buffer_origin):
                self._flat[self._n_params + i].copy_(orig)
        self.env = {}
        self.snapshots: dict[fx.Node, Any] = {}
        self._args = self.joint.runtime.prepare(self.joint, self._flat)
        self.position = 0
        self.raw_outputs: Any = None
        self.result: RunResult | None = None
        self._rng.reset()

    @property
    def done(self) -> bool:
        """True once the output node has run."""
        return self.position >= len(self.nodes)

    def buffers(self) -> dict[str, torch.Tensor]:
        """The runner's own copies of the model buffers, by FQN (mutated by the graph)."""
        n_state = self.joint.num_state_inputs
        return dict(zip(self._buffer_names, self._flat[self._n_params:n_state]))

    def node(self, name: str | fx.Node) -> fx.Node:
        """The graph node called ``name`` (a node is returned as is).

        Raises:
            ValueNotAvailableError: The graph has no such node.
        """
        if isinstance(name, fx.Node):
            return name
        for n in self.nodes:
            if n.name == name:
                return n
        raise ValueNotAvailableError(f"the graph has no node named {name!r}")

    def lookup(self, node: fx.Node) -> Any:
        """The value ``node`` produced, if still held (kept, live, or a graph output), else None.

        ``node`` may belong to the traced graph itself when the runner runs a
        copy moved to another device: it is matched by name.
        """
        if node.graph is not self.graph:
            node = self.node(node.name)
        if node in self.snapshots:  # kept, and later overwritten in place: as produced
            return self.snapshots[node]
        if node in self.env:
            return self.env[node]
        if self.raw_outputs is not None:
            outs = list(self.nodes[-1].args[0])
            if node in outs:
                return self.raw_outputs[outs.index(node)]
        return None

    @functools.cached_property
    def _random(self) -> list[bool]:
        """Per node, whether it draws from the RNG (built on first stepping, not for whole runs)."""
        return [draws_random(n) for n in self.nodes]

    @functools.cached_property
    def _free(self) -> list[list[fx.Node]]:
        """Per node, the values that die after it runs (built on first stepping)."""
        last: dict[fx.Node, int] = {}
        for i, n in enumerate(self.nodes):
            for a in n.all_input_nodes:
                last[a] = i
        free: list[list[fx.Node]] = [[] for _ in self.nodes]
        if self.keep_all:
            return free
        for n, i in last.items():
            if n.name not in self.keep:
                free[i].append(n)
        return free

    def _snapshot_nodes(self) -> set[fx.Node]:
        """Kept nodes whose storage a later in-place op overwrites: copied when produced."""
        if not self.keep_all and not self.keep:
            return set()
        written = written_in_place(self.joint.graph_module)  # names survive retargeting
        return {n for n in self.nodes if self.kept(n) and n.name in written
                and n.op != "output"}

    def _snapshot_plan(self, settle: Mapping[str, str]) -> dict[fx.Node, list[fx.Node]]:
        """``{node: kept nodes copied once it ran}``: as produced, or after their settling write."""
        by_name = {n.name: n for n in self.nodes}
        plan: dict[fx.Node, list[fx.Node]] = {}
        for n in self._snapshot_nodes():
            plan.setdefault(by_name.get(settle.get(n.name, ""), n), []).append(n)
        return plan

    def kept(self, n: fx.Node) -> bool:
        """True when ``n``'s value outlives its last use."""
        return self.keep_all or n.name in self.keep

    # -- one node -----------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        """Run one node (placeholders read the bound arguments); failures name the node.

        Raises:
            NodeExecutionError: The node raised; torch's error is the cause.
        """
        try:
            if n.op == "placeholder":
                return self._args[self._placeholder_index[n]]
            return super().run_node(n)
        except Exception as exc:  # noqa: BLE001 - re-raised with the node attached
            raise node_error(n, exc) from exc

    def step_node(self) -> Any:
        """Run the node at :attr:`position` in the runner's RNG stream; return its value."""
        pos = self.position
        node = self.nodes[pos]
        user = self._rng.enter() if self._random[pos] else None
        try:
            with torch.no_grad():
                value = self.run_node(node)
        finally:
            self._rng.exit(user)
        if node.op == "output":
            self._finish(value)
        else:
            self.env[node] = value
            for n in self._snap.get(node, ()):
                if isinstance(self.env.get(n), torch.Tensor):
                    self.snapshots[n] = self.env[n].clone()
        for dead in self._free[pos]:
            self.env.pop(dead, None)
        self.position = pos + 1
        return value

    def _finish(self, outputs: Any) -> None:
        """Turn the output node's value into :attr:`result`, once (AOT: buffer updates land)."""
        self.raw_outputs = outputs
        with torch.no_grad():
            self.result = run_result(
                self.joint, *self.joint.runtime.finish(self.joint, list(outputs), self._flat))

    # -- ranges -------------------------------------------------------------------
    def advance(self, stop: int) -> None:
        """Run every node before index ``stop``."""
        stop = min(stop, len(self.nodes))
        if self.position == 0 and stop == len(self.nodes) and not self._keeps_any():
            self._run_whole()
            return
        out_idx = len(self.nodes) - 1
        while self.position < stop and self.nodes[self.position].op == "placeholder":
            self.step_node()
        end = min(stop, out_idx)
        if end - self.position >= _FAST_MIN_NODES:
            self._run_segment(self.position, end)
        while self.position < stop:
            self.step_node()

    def _keeps_any(self) -> bool:
        return self.keep_all or bool(self.keep)

    def _guarded_call(self, fn: Callable[..., Any], args: list[Any], a: int, b: int,
                      random: bool = True) -> Any:
        """``fn(*args)`` for nodes ``a..b``; on failure, replay them one by one to the culprit.

        With ``random`` the call runs in the runner's RNG stream (harmless where
        no node draws: the stream is left as it was).
        """
        rng_state = self._rng.state
        user = self._rng.enter() if random else None
        try:
            with torch.no_grad():
                results = fn(*args)
        except Exception:
            self._rng.exit(user)
            self._rng.state = rng_state
            self._replay_failure(b)
            raise
        self._rng.exit(user)
        return results

    def _run_whole(self) -> None:
        """Run the whole graph through the GraphModule itself (nothing is kept)."""
        outputs = self._guarded_call(self.module, self._args, 0, len(self.nodes))
        self.env = {n: self._args[i] for n, i in self._placeholder_index.items() if not n.users}
        self._finish(outputs)
        self.position = len(self.nodes)

    def _run_segment(self, a: int, b: int) -> None:
        fn, live_in, live_out = self._segment(a, b)
        results = self._guarded_call(fn, [self.env[n] for n in live_in], a, b,
                                     any(self._random[a:b]))
        for n, v in zip(live_out, results):
            self.env[n] = v
        snapped = [n for t in self.nodes[a:b] for n in self._snap.get(t, ())]
        self.snapshots.update(zip(snapped, results[len(live_out):]))
        for i in range(a, b):
            for dead in self._free[i]:
                self.env.pop(dead, None)
        self.position = b

    def _replay_failure(self, b: int) -> None:
        """Re-run a failed range node by node so the runner stops at the culprit."""
        n_state = self.joint.num_state_inputs
        saved = [t.clone() for t in self._flat[self._n_params:n_state]]
        try:
            while self.position < b:
                self.step_node()
        except NodeExecutionError:
            with torch.no_grad():
                for i, s in enumerate(saved):
                    self._flat[self._n_params + i].copy_(s)
            raise

    def _segment(self, a: int, b: int) -> Segment:
        key = (a, b)
        if key not in self._segments:
            self._segments[key] = self._build_segment(a, b)
        return self._segments[key]

    def _build_segment(self, a: int, b: int) -> Segment:
        inside = self.nodes[a:b]
        inside_set = set(inside)
        index = {n: i for i, n in enumerate(self.nodes)}
        read_after = {n for t in inside for n in self._snap.get(t, ())}  # snapshots taken here
        live_in = [n for n in self.nodes[:a]
                   if n in read_after or any(u in inside_set for u in n.users)]
        live_out = [n for n in inside if self.kept(n) or any(index[u] >= b for u in n.users)]
        g = fx.Graph()
        remap: dict[fx.Node, fx.Node] = {}
        for n in live_in:
            remap[n] = g.placeholder(n.name)  # no meta: the segment never shares the user's
        copies = []
        for n in inside:
            remap[n] = g.node_copy(n, lambda x: remap[x])
            for m in self._snap.get(n, ()):  # copy before a later in-place op writes it
                copies.append(g.call_function(_clone_tensor, (remap[m],)))
        g.output(tuple(remap[n] for n in live_out) + tuple(copies))
        return fx.GraphModule(self.module, g), live_in, live_out
