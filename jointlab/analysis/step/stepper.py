"""Run a joint graph node by node: the :class:`Stepper`, and ``compile_joint``.

The stepper is a ``torch.fx.Interpreter`` over the joint graph. It binds the
model's state and the inputs on a device of the user's choice (cloning the
buffers, so the graph's in-place updates never reach the user's model), then
runs nodes one at a time (:meth:`Stepper.step`) or in bulk
(:meth:`Stepper.run`). Bulk runs go through generated code for the range of
nodes between the current position and the next breakpoint, so without
breakpoints they cost what the GraphModule costs. Values are freed after
their last use, as the GraphModule frees them, unless ``keep`` asks otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab.analysis.compare.compare import compare
from jointlab.analysis.compile import CompiledJoint, compile_joint
from jointlab.analysis.step.breakpoints import Breakpoint, _predicate, draws_random, in_module
from jointlab.analysis.step.rng import StepRng, retarget
from jointlab.errors import NodeExecutionError, ValueNotAvailableError
from jointlab.meta import node_error
from jointlab.passes.analyze import written_in_place

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.core import TracedGraph as JointGraph

__all__ = ["Breakpoint", "CompiledJoint", "Stepper", "compare", "compile_joint"]

_FAST_MIN_NODES = 16  # below this, stepping node by node is cheaper than codegen

def _clone_tensor(value: Any) -> Any:
    """A copy of a tensor value (other values as they are)."""
    return value.clone() if isinstance(value, torch.Tensor) else value


# -- the stepper ---------------------------------------------------------------
class Stepper(fx.Interpreter):
    """Execute a joint graph one node at a time, with breakpoints and inspection.

    Attributes:
        position: Index in ``list(graph.nodes)`` of the next node to run.
        hit: The breakpoint and node that stopped the last :meth:`run`, or None.
    """

    def __init__(self, joint: JointGraph, model: nn.Module, inputs: dict[str, Any], *,
                 device: str | torch.device | None = None, seed: int | None = None,
                 keep: str | Iterable[str] | None = None) -> None:
        """Bind ``model``'s state and ``inputs`` to the graph on ``device``.

        Args:
            joint: The traced joint graph.
            model: The model (its buffers are cloned; the model is never changed).
            inputs: Keyword inputs with the traced structure.
            device: Where to run; default ``"cuda"`` when available, else ``"cpu"``.
            seed: Start the graph's RNG from this seed (and again on :meth:`reset`).
            keep: ``"all"`` or a set of node names whose values outlive their last use.
        """
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        gm = joint.graph_module
        traced_on = {d for d in joint.state_spec.devices}
        if traced_on and traced_on != {self.device}:
            gm = retarget(gm, self.device)
        super().__init__(gm, garbage_collect_values=False)
        self.joint, self.model, self.inputs, self.seed = joint, model, inputs, seed
        self.keep_all = keep == "all"
        self.keep = set() if keep is None or self.keep_all else set(keep)
        self.nodes: list[fx.Node] = list(self.graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self._free = self._free_lists()
        self._snap = self._snapshot_nodes()
        flat = [t.to(self.device) for t in joint.flat_args(model, inputs)]
        n_params = joint.num_state_inputs - len(joint.buffer_names)
        self._buffer_origin = [t.clone() for t in flat[n_params:joint.num_state_inputs]]
        flat[n_params:joint.num_state_inputs] = [t.clone() for t in self._buffer_origin]
        self._flat = flat
        self._rng = StepRng(seed, self.device)
        self._random = [draws_random(n) for n in self.nodes]
        self._segments: dict[tuple, Callable] = {}
        self.breakpoints: list[Breakpoint] = []
        self.timings: dict[str, tuple[float, int, int]] = {}
        self.hit: tuple[Breakpoint, fx.Node] | None = None
        self.reset()

    # -- state ------------------------------------------------------------------
    def reset(self) -> None:
        """Go back to the first node: drop values, restore buffers, reseed."""
        n_params = self.joint.num_state_inputs - len(self._buffer_origin)
        with torch.no_grad():
            for i, orig in enumerate(self._buffer_origin):
                self._flat[n_params + i].copy_(orig)
        self.env = {}
        self.snapshots: dict[fx.Node, Any] = {}
        self.args_iter = iter(self.joint.runtime.prepare(self.joint, self._flat))
        self.position = 0
        self.hit = None
        self._outputs: Any = None
        self.timings = {}
        self._rng.reset()

    @property
    def current(self) -> fx.Node | None:
        """The next node to run (None once done)."""
        return None if self.done else self.nodes[self.position]

    @property
    def done(self) -> bool:
        """True once the output node has run."""
        return self.position >= len(self.nodes)

    @property
    def outputs(self) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]] | None:
        """``(loss, grads by FQN, loss_dict)`` once :attr:`done`, else None."""
        if self._outputs is None:
            return None
        loss, grads, ld = self.joint.runtime.finish(self.joint, list(self._outputs), self._flat)
        return (loss, dict(zip(self.joint.param_names, grads)),
                dict(zip(self.joint.loss_dict_keys, ld)))

    def buffers(self) -> dict[str, torch.Tensor]:
        """The stepper's own copies of the model buffers, by FQN (mutated by the graph)."""
        n_params = self.joint.num_state_inputs - len(self._buffer_origin)
        return dict(zip(self.joint.buffer_names, self._flat[n_params:self.joint.num_state_inputs]))

    def value(self, name: str | fx.Node) -> Any:
        """Return the value computed for node ``name``.

        Raises:
            ValueNotAvailableError: Not computed yet, or freed after its last use.
        """
        node = self._node(name)
        if node in self.snapshots:  # kept, and later overwritten in place: as produced
            return self.snapshots[node]
        if node in self.env:
            return self.env[node]
        if self.index[node] >= self.position:
            raise ValueNotAvailableError(
                f"node '{node.name}' has not run yet (stepper is at position {self.position}, "
                f"it is at {self.index[node]}). Step further, or add a breakpoint after it.")
        raise ValueNotAvailableError(
            f"the value of '{node.name}' was freed after its last use. Create the Stepper "
            f"with keep={{'{node.name}'}} or keep='all' to inspect it afterwards.")

    def _node(self, name: str | fx.Node) -> fx.Node:
        if isinstance(name, fx.Node):
            return name
        for n in self.nodes:
            if n.name == name:
                return n
        raise ValueNotAvailableError(f"the graph has no node named {name!r}")

    def _snapshot_nodes(self) -> set[fx.Node]:
        """Kept nodes whose storage a later in-place op overwrites: copied when produced."""
        if not self.keep_all and not self.keep:
            return set()
        written = written_in_place(self.joint.graph_module)
        return {n for n in self.nodes if self._kept(n) and n.name in written
                and n.op != "output"}

    def _free_lists(self) -> list[list[fx.Node]]:
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

    # -- breakpoints ----------------------------------------------------------
    def add_breakpoint(self, node: str | fx.Node | None = None, module: str | None = None,
                       op: str | None = None, when: Any = None) -> Breakpoint:
        """Stop :meth:`run` at a node, a module prefix, an op, or a value condition.

        Args:
            node: A node (or its name): stop before it.
            module: A module FQN prefix: stop before its first node (backward nodes too).
            op: An op (``"aten.mm"``, ``"mm"`` or ``"aten.mm.default"``).
            when: A predicate on a node's value, or ``"non-finite"``: stop after
                the first (selected) node whose value satisfies it.

        Returns:
            The breakpoint (pass it to :meth:`remove_breakpoint`).
        """
        name = node.name if isinstance(node, fx.Node) else node
        if name is not None:
            self._node(name)
        bp = Breakpoint(name, module, op, _predicate(when))
        self.breakpoints.append(bp)
        return bp

    def remove_breakpoint(self, bp: Breakpoint) -> None:
        """Remove one breakpoint."""
        self.breakpoints.remove(bp)

    def clear_breakpoints(self) -> None:
        """Remove every breakpoint."""
        self.breakpoints.clear()

    def _next_static_stop(self, start: int) -> tuple[int, Breakpoint | None]:
        static = [b for b in self.breakpoints if b.when is None]
        for i in range(start, len(self.nodes)):
            for b in static:
                if b.selects(self.nodes[i]):
                    return i, b
        return len(self.nodes), None

    # -- execution --------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        """Run one node; re-raise failures as :class:`NodeExecutionError`."""
        try:
            if n.op == "placeholder":
                return next(self.args_iter)
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if n.op == "call_function":
                return n.target(*args, **kwargs)
            return getattr(self, n.op)(n.target, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised with the node attached
            raise node_error(n, exc) from exc

    def step(self, n: int = 1) -> Any:
        """Run the next ``n`` nodes; return the value of the last one run."""
        value = None
        for _ in range(n):
            if self.done:
                break
            value = self._step_one()
        return value

    def _step_one(self) -> Any:
        pos = self.position
        node = self.nodes[pos]
        user = self._rng.enter() if self._random[pos] else None
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
            mem0 = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                value = self.run_node(node)
            if sync:
                torch.cuda.synchronize(self.device)
        finally:
            self._rng.exit(user)
        dt = time.perf_counter() - t0
        if sync:
            peak = torch.cuda.max_memory_allocated(self.device) - mem0
            delta = torch.cuda.memory_allocated(self.device) - mem0
            self.timings[node.name] = (dt, delta, peak)
        else:
            self.timings[node.name] = (dt, 0, 0)
        if node.op == "output":
            self._outputs = value
        else:
            self.env[node] = value
            if node in self._snap and isinstance(value, torch.Tensor):
                self.snapshots[node] = value.clone()
        for dead in self._free[pos]:
            self.env.pop(dead, None)
        self.position = pos + 1
        return value

    def run(self) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]] | None:
        """Run until a breakpoint or the end.

        Returns:
            :attr:`outputs` when the graph finished, None when a breakpoint stopped it.

        Raises:
            NodeExecutionError: A node failed; the stepper is left positioned at it.
        """
        self.hit = None
        if not self.done and self._static_hit(self.position):
            self._step_one()  # we are parked on a breakpoint: move past it first
        watched = [b for b in self.breakpoints if b.when is not None]
        while not self.done:
            stop, bp = self._next_static_stop(self.position)
            if watched:
                if self._watch_until(stop, watched):
                    return None
            else:
                self._advance(stop)
            if bp is not None and not self.done:
                self.hit = (bp, self.nodes[self.position])
                return None
        return self.outputs

    def _static_hit(self, pos: int) -> bool:
        return any(b.when is None and b.selects(self.nodes[pos]) for b in self.breakpoints)

    def _watch_until(self, stop: int, watched: list[Breakpoint]) -> bool:
        while self.position < stop:
            node = self.nodes[self.position]
            value = self._step_one()
            for b in watched:
                if b.selects(node) and b.when(value):
                    self.hit = (b, node)
                    return True
        return False

    def run_to(self, stop: int) -> None:
        """Run every node before index ``stop`` (ignoring breakpoints)."""
        self._advance(min(stop, len(self.nodes)))

    def step_over_module(self, module: str | None = None) -> None:
        """Run until the next node outside ``module`` (default: the current node's module)."""
        if self.done:
            return
        prefix = _meta.module(self.current) if module is None else module
        stop = self.position
        while stop < len(self.nodes) and in_module(self.nodes[stop], prefix):
            stop += 1
        self._advance(max(stop, self.position + 1))

    def _advance(self, stop: int) -> None:
        out_idx = len(self.nodes) - 1
        while self.position < stop and self.nodes[self.position].op == "placeholder":
            self._step_one()
        end = min(stop, out_idx)
        if end - self.position >= _FAST_MIN_NODES:
            self._run_segment(self.position, end)
        while self.position < stop:
            self._step_one()

    def _run_segment(self, a: int, b: int) -> None:
        fn, live_in, live_out = self._segment(a, b)
        args = [self.env[n] for n in live_in]
        rng_state = self._rng.state
        user = self._rng.enter() if any(self._random[a:b]) else None
        try:
            with torch.no_grad():
                results = fn(*args)
        except Exception:
            self._rng.exit(user)
            self._rng.state = rng_state
            self._replay_failure(a, b)
            raise
        self._rng.exit(user)
        del args
        for n, v in zip(live_out, results):
            self.env[n] = v
        snapped = [n for n in self.nodes[a:b] if n in self._snap]
        self.snapshots.update(zip(snapped, results[len(live_out):]))
        for i in range(a, b):
            for dead in self._free[i]:
                self.env.pop(dead, None)
        self.position = b

    def _replay_failure(self, a: int, b: int) -> None:
        """Re-run a failed segment node by node so the stepper stops at the culprit."""
        n_params = self.joint.num_state_inputs - len(self._buffer_origin)
        saved = [t.clone() for t in self._flat[n_params:self.joint.num_state_inputs]]
        try:
            while self.position < b:
                self._step_one()
        except NodeExecutionError:
            with torch.no_grad():
                for i, s in enumerate(saved):
                    self._flat[n_params + i].copy_(s)
            raise

    def _segment(self, a: int, b: int) -> tuple[Callable, list[fx.Node], list[fx.Node]]:
        key = (a, b)
        if key not in self._segments:
            self._segments[key] = self._build_segment(a, b)
        return self._segments[key]

    def _build_segment(self, a: int, b: int):
        inside = self.nodes[a:b]
        inside_set = set(inside)
        live_in = [n for n in self.nodes[:a]
                   if any(u in inside_set for u in n.users)]
        live_out = [n for n in inside if self._kept(n) or any(
            self.index[u] >= b for u in n.users)]
        g = fx.Graph()
        remap: dict[fx.Node, fx.Node] = {}
        for n in live_in:
            remap[n] = g.placeholder(n.name)
            remap[n].meta = n.meta
        copies = []
        for n in inside:
            remap[n] = g.node_copy(n, lambda x: remap[x])
            if n in self._snap:  # copy the value before a later in-place op writes it
                copies.append(g.call_function(_clone_tensor, (remap[n],)))
        g.output(tuple(remap[n] for n in live_out) + tuple(copies))
        gm = fx.GraphModule(self.module, g)
        return gm, live_in, live_out

    def _kept(self, n: fx.Node) -> bool:
        return self.keep_all or n.name in self.keep

    # -- reports ------------------------------------------------------------------
    def node_timings(self) -> pd.DataFrame:
        """Per-node time and memory of the nodes stepped so far, joinable with ``joint.nodes``.

        Returns:
            A DataFrame indexed by node name with ``step_s`` (wall time, synchronized
            on CUDA), ``step_mem_delta`` and ``step_mem_peak`` (bytes, CUDA only).
        """
        import pandas as pd

        df = pd.DataFrame.from_dict(self.timings, orient="index",
                                    columns=["step_s", "step_mem_delta", "step_mem_peak"])
        df.index.name = "node"  # as joint.nodes (README "Naming")
        return df

    def widget(self, train_fn: Any = None, comparison: Any = None,
               dag: bool | None = None) -> Any:
        """An ipywidgets panel to drive this stepper (see :mod:`jointlab.widgets._stepper`).

        Args:
            train_fn: The training step, for the panel's comparison with eager.
            comparison: A Comparison to show from the start.
            dag: Show the DAG with the current node ringed (default: small graphs).

        Returns:
            An ``ipywidgets.VBox``.
        """
        from jointlab.widgets._stepper import stepper_widget

        return stepper_widget(self, train_fn=train_fn, comparison=comparison, dag=dag)

    def __repr__(self) -> str:
        """Where the stepper stands."""
        where = "done" if self.done else f"at {self.position}: {self.current.format_node()}"
        return f"Stepper({len(self.nodes)} nodes, {where})"
