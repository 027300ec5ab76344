"""The :class:`Stepper`: run a joint graph node by node, with breakpoints and inspection.

The stepper drives a :class:`jointlab.analysis.step.runner.NodeRunner` (an
``fx.Interpreter`` bound to the model's state on a device of the user's
choice, with its own RNG stream). It adds what a user steps with:
breakpoints on a node, a module, an op or a value condition; per-node
timings (and CUDA memory, synchronized); stepping over a module; the
comparison with eager from the same start; and the ipywidgets panel. Bulk
runs go through generated code between breakpoints, so without breakpoints
creating a stepper and running it to the end costs what ``joint.run`` costs.

Given a compiled joint graph (``joint.compile("inductor")``), ``jl.Stepper``
returns a :class:`jointlab.analysis.step.compiled.CompiledStepper`, which runs
the generated code kernel by kernel (never the uncompiled graph in its place).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab.analysis.step.breakpoints import (
    Breakpoint,
    BreakpointList,
    _predicate,
    check_breakpoint,
)
from jointlab.analysis.step.compiled import CompiledStepper, is_compiled_joint
from jointlab.analysis.step.runner import NodeRunner, check_call
from jointlab.core import RunResult, TracedGraph
from jointlab.display import render
from jointlab.errors import StepperError, ValueNotAvailableError

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.analysis.compare.compare import Comparison

__all__ = ["Breakpoint", "Stepper"]


# -- the stepper ---------------------------------------------------------------
class Stepper(BreakpointList):
    """Execute a joint graph one node at a time, with breakpoints and inspection.

    Attributes:
        joint: The traced graph being stepped.
        runner: The node runner that holds the values.
        hit: The breakpoint and node that stopped the last :meth:`run`, or None.
        timings: Per stepped node name, ``(seconds, memory delta, memory peak)``.
    """

    def __new__(cls, joint: Any, *args: Any, **kwargs: Any) -> Any:
        """A :class:`CompiledStepper` for a compiled joint graph, else a node :class:`Stepper`."""
        if is_compiled_joint(joint):
            return CompiledStepper(joint, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, joint: TracedGraph, model: nn.Module, inputs: dict[str, Any], *,
                 device: str | torch.device | None = None, seed: int | None = None,
                 keep: str | Iterable[str] | None = None) -> None:
        """Bind ``model``'s state and ``inputs`` to the graph on ``device``.

        Args:
            joint: The traced joint graph (a compiled one gets a :class:`CompiledStepper`).
            model: The model (its buffers are cloned; the model is never changed).
            inputs: Keyword inputs with the traced structure.
            device: Where to run; default ``"cuda"`` when available, else ``"cpu"``.
            seed: Start the graph's RNG from this seed (and again on :meth:`reset`).
            keep: ``"all"`` or a set of node names whose values outlive their last use.

        Raises:
            jointlab.errors.StepperError: ``joint``, ``model`` or ``inputs`` is of the wrong kind.
        """
        check_call(joint, model, inputs, StepperError, "jl.Stepper")
        self.joint, self.model, self.inputs, self.seed = joint, model, inputs, seed
        self.runner = NodeRunner(joint, model, inputs, device=device, seed=seed, keep=keep)
        self.device = self.runner.device
        self.breakpoints: list[Breakpoint] = []
        self.timings: dict[str, tuple[float, int, int]] = {}
        self.hit: tuple[Breakpoint, fx.Node] | None = None

    # -- state ------------------------------------------------------------------
    def reset(self) -> None:
        """Go back to the first node: drop values, restore buffers, reseed."""
        self.runner.reset()
        self.hit = None
        self.timings = {}

    @property
    def nodes(self) -> list[fx.Node]:
        """The graph's nodes, in the order they run."""
        return self.runner.nodes

    @property
    def position(self) -> int:
        """Index in :attr:`nodes` of the next node to run."""
        return self.runner.position

    @property
    def env(self) -> dict[fx.Node, Any]:
        """The values held now, by node (freed after their last use unless kept)."""
        return self.runner.env

    @property
    def current(self) -> fx.Node | None:
        """The next node to run (None once done)."""
        return None if self.done else self.nodes[self.position]

    @property
    def done(self) -> bool:
        """True once the output node has run."""
        return self.runner.done

    @property
    def outputs(self) -> RunResult | None:
        """``(loss, grads by FQN, loss_dict)`` once :attr:`done`, else None (a pure read)."""
        return self.runner.result

    def buffers(self) -> dict[str, torch.Tensor]:
        """The stepper's own copies of the model buffers, by FQN (mutated by the graph)."""
        return self.runner.buffers()

    def value(self, name: str | fx.Node) -> Any:
        """Return the value computed for node ``name``.

        Raises:
            ValueNotAvailableError: Not computed yet, or freed after its last use.
        """
        runner = self.runner
        node = runner.node(name)
        if node in runner.snapshots:  # kept, and later overwritten in place: as produced
            return runner.snapshots[node]
        if node in runner.env:
            return runner.env[node]
        at = self.nodes.index(node)
        if at >= self.position:
            raise ValueNotAvailableError(
                f"node '{node.name}' has not run yet (stepper is at position {self.position}, "
                f"it is at {at}). Step further, or add a breakpoint after it.")
        raise ValueNotAvailableError(
            f"the value of '{node.name}' was freed after its last use. Create the Stepper "
            f"with keep={{'{node.name}'}} or keep='all' to inspect it afterwards.")

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

        Raises:
            StepperError: ``module`` or ``op`` matches no node of the graph (the error
                names the nearest real ones), or the parts together match no node.
        """
        name = node.name if isinstance(node, fx.Node) else node
        if name is not None:
            self.runner.node(name)
        bp = Breakpoint(name, module, op, _predicate(when))
        check_breakpoint(bp, self.nodes)
        self.breakpoints.append(bp)
        return bp

    def _next_static_stop(self, start: int) -> tuple[int, Breakpoint | None]:
        static = [b for b in self.breakpoints if b.when is None]
        for i in range(start, len(self.nodes)):
            for b in static:
                if b.selects(self.nodes[i]):
                    return i, b
        return len(self.nodes), None

    # -- execution --------------------------------------------------------------
    def step(self, n: int = 1) -> Any:
        """Run the next ``n`` nodes; return the value of the last one run."""
        value = None
        for _ in range(n):
            if self.done:
                break
            value = self._step_one()
        return value

    def _step_one(self) -> Any:
        """Run one node, recording its time (and CUDA memory, synchronized)."""
        name = self.nodes[self.position].name
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
            mem0 = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        value = self.runner.step_node()
        if sync:
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        if sync:
            peak = torch.cuda.max_memory_allocated(self.device) - mem0
            delta = torch.cuda.memory_allocated(self.device) - mem0
            self.timings[name] = (dt, delta, peak)
        else:
            self.timings[name] = (dt, 0, 0)
        return value

    def run(self) -> RunResult | None:
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
                self.runner.advance(stop)
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
        self.runner.advance(stop)

    def step_over_module(self, module: str | None = None) -> None:
        """Run until the next node outside ``module`` (default: the current node's module)."""
        if self.done:
            return
        prefix = _meta.module(self.current) if module is None else module
        stop = self.position
        while stop < len(self.nodes) and _meta.in_module(_meta.module(self.nodes[stop]), prefix):
            stop += 1
        self.runner.advance(max(stop, self.position + 1))

    # -- reports ------------------------------------------------------------------
    def node_timings(self) -> pd.DataFrame:
        """Per-node time and memory of the nodes stepped so far, joinable with ``joint.nodes``.

        Returns:
            A DataFrame indexed by node name with ``step_s`` (wall time, synchronized
            on CUDA), ``step_mem_delta`` and ``step_mem_peak`` (bytes, CUDA only).

        Raises:
            ValueNotAvailableError: Nodes ran, but in bulk (``run()`` without
                breakpoints runs whole ranges at once), so none has its own time.
        """
        import pandas as pd

        if not self.timings and self.position > 0:
            raise ValueNotAvailableError(
                f"{self.position} nodes ran in bulk (run() without breakpoints executes whole "
                "ranges at once), so no node has its own time. Step node by node with "
                "step(n) to time them, or use jl.record(joint, model, inputs) for every node.")

        from jointlab.analysis.tables import HumanFrame

        df = HumanFrame(pd.DataFrame.from_dict(
            self.timings, orient="index", columns=["step_s", "step_mem_delta", "step_mem_peak"]))
        df.index.name = "node"  # as joint.nodes (README "Naming")
        return df

    def compare(self, train_fn: Any = None, **options: Any) -> Comparison:
        """Compare this stepper's graph with eager autograd from the same model, inputs and seed.

        Args:
            train_fn: The training step; default ``joint.train_fn``.
            **options: More keywords for :func:`jointlab.compare` (``rtol``, ``exact``, ...).

        Returns:
            A :class:`jointlab.Comparison` (on this stepper's device, seed 0 without a seed).
        """
        from jointlab.analysis.compare.compare import compare  # not needed to step

        return compare(self.joint, self.model, self.inputs, train_fn=train_fn,
                       device=self.device, seed=self.seed or 0, **options)

    def widget(self, train_fn: Any = None, comparison: Any = None,
               dag: bool | None = None) -> Any:
        """An ipywidgets panel to drive this stepper (the ``"stepper_widget"`` renderer).

        Args:
            train_fn: The training step, for the panel's comparison with eager.
            comparison: A Comparison to show from the start.
            dag: Show the DAG with the current node ringed (default: small graphs).

        Returns:
            An ``ipywidgets.VBox``.
        """
        return render("stepper_widget", self, train_fn=train_fn, comparison=comparison, dag=dag)

    def __repr__(self) -> str:
        """Where the stepper stands, in one line.

        ``<Stepper 'GPT2LMHeadModel' graph: at node 57/445 'addmm_3' (forward,
        transformer.h.0.attn.c_attn), breakpoints: 2>``: the node number is
        :attr:`position` (the next node to run is ``nodes[57]``); a parameter,
        buffer or input placeholder is named by its FQN or input path.
        """
        total = len(self.nodes)
        if self.done:
            where = f"done ({total}/{total} nodes run)"
        else:
            node = self.current
            m = _meta.info(node)
            name = _meta.value_name(node)
            named = f"{node.name!r} = {name}" if name != node.name else repr(node.name)
            owner = _meta.module_label(m.get("module"))
            where = (f"at node {self.position}/{total} {named} "
                     f"({m.get('phase', '?')}, {owner})")
        return (f"<Stepper {type(self.model).__name__!r} graph: {where}, "
                f"breakpoints: {len(self.breakpoints)}>")
