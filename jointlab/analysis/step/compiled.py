"""Stepping a compiled joint graph kernel by kernel: ``jl.Stepper(joint.compile("inductor"), ...)``.

:class:`CompiledStepper` runs the code Inductor generated, **kernel by
kernel** (``granularity = "kernel"``): the wrapper's ``call`` is cut into one
piece per kernel call (:mod:`jointlab.analysis.step.kernel_code`) and the
pieces run in order on one namespace, so stepping to the end runs exactly
what one call of the compiled module runs, calling the same compiled kernels.
Nothing steps the uncompiled graph in its place; what cannot be stepped
(another backend, dynamic shapes, generated code without kernel handles) is
refused with :class:`jointlab.errors.CompiledGraphError`.

At each stop :meth:`CompiledStepper.boundary` lists the buffers the kernel
just run wrote, the joint-graph node each holds (from Inductor's own record of
the post-grad node a buffer is the value of, kept only when that node is the
joint node itself: same op, same shape), and compares them with the uncompiled
graph drawing the same RNG stream and, where the node is a probed module
output, with eager; a row that does not match says why in its note.

The generated ``call`` takes the graph's args after the tensor constants the
trace baked in (a captured tensor, HF's KV-cache placeholders), which Inductor
lifted to inputs; the stepper passes them first, as the compiled module does.
Random ops draw what ``compiled.run`` draws: with ``seed=`` what it draws after
``torch.manual_seed(seed)``, without one what it would draw from the user's RNG
state when the stepper was created (kept, so :meth:`CompiledStepper.reset`
replays it; the user's RNG is never advanced).

A buffer that holds no single joint node's value says so instead of being
compared with a guess. Breakpoints on a node, module or op stop before
the first kernel that covers a node they select. Per-kernel timings live in
:mod:`jointlab.analysis.step.kernel_timing`.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from jointlab import meta as _meta
from jointlab import torch_compat
from jointlab.analysis.kernels import kernel_map
from jointlab.analysis.step.boundary import boundary_table, node_of
from jointlab.analysis.step.breakpoints import Breakpoint, BreakpointList
from jointlab.analysis.step.compiled_checks import (
    check_arity,
    check_device,
    kernel_breakpoint,
    refuse_unsteppable,
)
from jointlab.analysis.step.compiled_checks import is_compiled_joint as is_compiled_joint
from jointlab.analysis.step.kernel_code import OUTPUTS, KernelPiece
from jointlab.analysis.step.kernel_timing import kernel_timings, module_timings
from jointlab.analysis.step.rng import StepRng
from jointlab.analysis.step.runner import check_call
from jointlab.core import RunResult
from jointlab.errors import CompiledGraphError, StepperError, ValueNotAvailableError
from jointlab.runtime.plans import run_result

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.analysis.compare.compare import Comparison

__all__ = ["CompiledStepper", "is_compiled_joint"]


class CompiledStepper(BreakpointList):
    """Run a compiled joint graph's generated code one kernel call at a time.

    Attributes:
        compiled: The :class:`jointlab.CompiledJoint` being stepped.
        joint: Its source graph (the traced joint graph).
        granularity: ``"kernel"``: each step runs one kernel call of the generated code.
        kernels: The kernel calls in the order they run (``name:call number``).
        covers: Per kernel call, the joint-graph nodes it covers (Inductor's provenance).
        joint_nodes: The source graph's nodes by name.
        namespace: The generated code's local variables now (its buffers, by name).
        hit: The breakpoint and kernel that stopped the last :meth:`run`, or None.
        timings: Per kernel call stepped, its wall time in seconds (synchronized on CUDA).
    """

    granularity = "kernel"

    def __init__(self, compiled: Any, model: nn.Module, inputs: dict[str, Any], *,
                 device: str | torch.device | None = None, seed: int | None = None,
                 keep: Any = None) -> None:
        """Bind ``model``'s state and ``inputs`` to the compiled code (compiling it if needed).

        Args:
            compiled: A :class:`jointlab.CompiledJoint` from ``joint.compile("inductor")``.
            model: The model (its buffers are cloned; the model is never changed).
            inputs: Keyword inputs with the traced structure.
            device: Must be where the graph was traced (the code was compiled for it).
            seed: Start the RNG stream of the random ops from this seed (and on :meth:`reset`):
                the masks ``torch.manual_seed(seed); compiled.run(...)`` draws. Without
                one, from the user's RNG state at creation: what ``compiled.run`` would
                draw if called instead (again on :meth:`reset`; the user's RNG is never
                advanced).
            keep: Refused: the generated code frees its buffers itself.

        Raises:
            jointlab.errors.CompiledGraphError: The compiled graph cannot be stepped, or
                ``device`` is not the one it was compiled for.
            jointlab.errors.StepperError: ``keep`` was given, or the model or inputs are
                of the wrong kind.
        """
        rng = StepRng(seed, torch.device(next(iter(compiled.source.state_spec.devices), "cpu")),
                      snapshot=True)  # the stream c.run would draw now: taken before all else
        refuse_unsteppable(compiled)
        check_call(compiled.source, model, inputs, StepperError, "jl.Stepper")
        if keep is not None:
            raise StepperError("keep= does not apply to compiled code: the generated code "
                               "frees its buffers itself. Read stepper.boundary() at a stop.")
        check_device(compiled.source, device)
        self.compiled, self.joint = compiled, compiled.source
        self.model, self.inputs, self.seed = model, inputs, seed
        self._bind(self.joint.flat_args(model, inputs))
        if compiled.compiled.fn is None:  # compile now, on a private copy, RNG untouched
            with torch.random.fork_rng(devices=[]):
                compiled.compiled(*self._fresh_args())
        inner = compiled.compiled
        self._globals = torch_compat.inductor_wrapper_globals(inner.fn)
        self._pieces: list[KernelPiece] = inner.kernel_pieces()
        check_arity(inner, len(self._fresh_args()))
        self.kernels = [p.kernel for p in self._pieces]
        cover = kernel_map(compiled)
        self.covers = {k: tuple(cover.get(k, ())) for k in self.kernels}
        self.joint_nodes = {n.name: n for n in self.joint.graph.nodes}
        self.device, self._rng = rng.device, rng
        self.breakpoints: list[Breakpoint] = []
        self._values: dict[str, dict[str, Any]] = {}
        self.reset()

    # -- state ------------------------------------------------------------------
    def _bind(self, flat: list[torch.Tensor]) -> None:
        n_state = self.joint.num_state_inputs
        n_buffers = sum(1 for p in self.joint.state_spec.is_param if not p)
        self._n_params = n_state - n_buffers
        self._buffer_origin = [t.clone() for t in flat[self._n_params:n_state]]
        self._flat = list(flat)

    def _fresh_args(self) -> list[Any]:
        """The compiled code's positional args, with fresh copies of the buffers."""
        n_state = self.joint.num_state_inputs
        self._flat[self._n_params:n_state] = [t.clone() for t in self._buffer_origin]
        return list(self.joint.runtime.prepare(self.joint, self._flat))

    def reset(self) -> None:
        """Go back to the first kernel: fresh buffers, fresh namespace, reseeded RNG."""
        runner = self._globals.get("runner")
        args = self.compiled.compiled.code_args(self._fresh_args())
        self.namespace: dict[str, Any] = {"args": args, "self": runner}
        self.position = 0
        self.hit: tuple[Breakpoint, str] | None = None
        self.timings: dict[str, float] = {}
        self.result: RunResult | None = None
        self._rng.reset()

    @property
    def done(self) -> bool:
        """True once the last kernel call ran (and the outputs were turned into a result)."""
        return self.position >= len(self._pieces)

    @property
    def current(self) -> str | None:
        """The next kernel call to run (None once done)."""
        return None if self.done else self.kernels[self.position]

    @property
    def last(self) -> str | None:
        """The kernel call run last (None before the first)."""
        return self.kernels[self.position - 1] if self.position else None

    @property
    def outputs(self) -> RunResult | None:
        """``(loss, grads by FQN, loss_dict)`` once :attr:`done`, else None."""
        return self.result

    # -- execution --------------------------------------------------------------
    def _run_piece(self) -> None:
        piece = self._pieces[self.position]
        sync = self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
        user = self._rng.enter()
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                exec(piece.code, self._globals, self.namespace)  # noqa: S102 - Inductor's code
            if sync:
                torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - re-raised with the kernel named
            raise CompiledGraphError(
                f"kernel call {piece.kernel} of the compiled graph failed: {exc}. The "
                "stepper stays before it; reset() starts again.") from exc
        finally:
            self._rng.exit(user)
        self.timings[piece.kernel] = time.perf_counter() - t0
        self.position += 1
        if piece.last:
            self._finish(self.namespace.pop(OUTPUTS))

    def _finish(self, outputs: Any) -> None:
        joint = self.joint
        with torch.no_grad():
            self.result = run_result(joint, *joint.runtime.finish(joint, list(outputs),
                                                                  self._flat))

    def step(self, n: int = 1) -> str | None:
        """Run the next ``n`` kernel calls; return the last one run."""
        for _ in range(n):
            if self.done:
                break
            self._run_piece()
        return self.last

    def run_to(self, stop: int) -> None:
        """Run every kernel call before index ``stop`` (ignoring breakpoints)."""
        while self.position < min(stop, len(self._pieces)):
            self._run_piece()

    def run(self) -> RunResult | None:
        """Run until a breakpoint or the end.

        Returns:
            :attr:`outputs` when the code finished, None when a breakpoint stopped it.
        """
        self.hit = None
        if not self.done and self._hit_at(self.position) is not None:
            self._run_piece()  # parked on a breakpoint: move past it first
        while not self.done:
            bp = self._hit_at(self.position)
            if bp is not None:
                self.hit = (bp, self.kernels[self.position])
                return None
            self._run_piece()
        return self.outputs

    # -- breakpoints ------------------------------------------------------------
    def _hit_at(self, pos: int) -> Breakpoint | None:
        by_name = self.joint_nodes
        for bp in self.breakpoints:
            if any(bp.selects(by_name[n]) for n in self.covers[self.kernels[pos]]):
                return bp
        return None

    def add_breakpoint(self, node: str | None = None, module: str | None = None,
                       op: str | None = None, when: Any = None) -> Breakpoint:
        """Stop :meth:`run` before the first kernel covering a node the parts select.

        Args:
            node: A joint-graph node name.
            module: A module FQN prefix (backward nodes too).
            op: An op (``"aten.mm"``, ``"mm"`` or ``"aten.mm.default"``).
            when: Refused: kernels write buffers, not node values, so value conditions
                are not checked on compiled code.

        Returns:
            The breakpoint.

        Raises:
            StepperError: The parts name nothing in the graph (with the nearest names), a
                value condition was given, or no kernel covers the nodes they select.
        """
        bp = kernel_breakpoint(self.joint, self.joint_nodes, self.covers, node, module, op,
                               when)
        self.breakpoints.append(bp)
        return bp

    # -- values at the boundary ---------------------------------------------------
    def buffer(self, name: str) -> torch.Tensor:
        """The compiled code's buffer ``name`` as it is now (e.g. ``"buf7"``).

        Raises:
            ValueNotAvailableError: The code has not created it yet, or freed it.
        """
        if name not in self.namespace:
            raise ValueNotAvailableError(
                f"buffer {name!r} is not held now (not created yet, or freed by the generated "
                f"code); the stepper is before kernel call {self.current or '(done)'}.")
        return self.namespace[name]

    def node_of(self, buffer: str) -> tuple[str | None, str]:
        """The joint-graph node whose value ``buffer`` holds, and why (or why none).

        Returns:
            ``(node name or None, note)`` (see :func:`~jointlab.analysis.step.boundary.node_of`).
        """
        return node_of(self, buffer)

    def boundary(self, *, eager: bool = False, rtol: float | None = None,
                 atol: float | None = None) -> pd.DataFrame:
        """The buffers the last kernel call wrote, compared with the uncompiled graph (and eager).

        Args:
            eager: Also compare with eager autograd where eager recorded the node
                (a probed module output or output gradient, or a view of the node).
            rtol: Relative tolerance (default: the graph's compute dtype's).
            atol: Absolute tolerance (default: a dtype fraction of each value's max |value|).

        Returns:
            A DataFrame indexed by buffer (see
            :func:`jointlab.analysis.step.boundary.boundary_table`).

        Raises:
            ValueNotAvailableError: No kernel call has run yet.
        """
        if self.position == 0:
            raise ValueNotAvailableError("no kernel call has run yet: step() first.")
        return boundary_table(self, self._pieces[self.position - 1].writes, eager=eager,
                              rtol=rtol, atol=atol)

    def same_stream(self) -> contextlib.AbstractContextManager[None]:
        """Within: the global RNG holds this stepper's start state (as at its first kernel).

        With ``seed=`` that is ``torch.manual_seed(seed)``'s state; without, the user's
        state when the stepper was created (what ``compiled.run`` would have drawn then).
        The user's state is put back on exit.
        """
        return self._rng.drawing()

    def cached_values(self, key: str, build: Any) -> dict[str, Any]:
        """``build(self)`` once per stepper (reference values for :meth:`boundary`)."""
        if key not in self._values:
            self._values[key] = build(self)
        return self._values[key]

    def kernel_info(self, kernel: str | None = None) -> dict[str, Any]:
        """What one kernel call covers: nodes, modules, phases (default: the last one run)."""
        kernel = kernel or self.last or self.current
        nodes = [self.joint_nodes[n] for n in self.covers.get(kernel, ())]
        return {"kernel": kernel, "nodes": tuple(n.name for n in nodes),
                "modules": tuple(dict.fromkeys(_meta.module(n) for n in nodes)),
                "phase": "+".join(dict.fromkeys(_meta.phase(n) or "?" for n in nodes))}

    def compare(self, train_fn: Any = None, **options: Any) -> Comparison:
        """Compare the compiled code (whole run) and its source graph with eager autograd.

        Args:
            train_fn: The training step; default ``compiled.source.train_fn``.
            **options: More keywords for :func:`jointlab.compare` (``rtol``, ...).

        Returns:
            A :class:`jointlab.Comparison` (seed 0 without a seed).
        """
        from jointlab.analysis.compare.compare import compare  # not needed to step

        return compare(self.compiled, self.model, self.inputs, train_fn=train_fn,
                       seed=self.seed or 0, **options)

    def value(self, name: str) -> NoReturn:
        """Refused: compiled code holds buffers, not node values.

        Raises:
            jointlab.errors.StepperError: Always; the message points at the way.
        """
        raise StepperError(
            f"a compiled stepper holds the generated code's buffers, not the value of node "
            f"{name!r}: read stepper.boundary() after a kernel (which names the node each "
            "buffer holds, where one does) or stepper.buffer('bufN'); step compiled.source "
            "with jl.Stepper for node values.")

    def widget(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: the stepper panel steps the traced graph node by node.

        Raises:
            jointlab.errors.StepperError: Always.
        """
        raise StepperError("the stepper widget drives a node Stepper; use "
                           "jl.Stepper(compiled.source, model, inputs).widget() for it.")

    def kernel_timings(self) -> pd.DataFrame:
        """Per kernel call run so far: kind, modules, phase, nodes, ``step_s``.

        Returns:
            See :func:`jointlab.analysis.step.kernel_timing.kernel_timings`.
        """
        return kernel_timings(self)

    def module_timings(self, repeat: int = 1) -> pd.DataFrame:
        """Kernel times summed to modules next to the uncompiled graph's per-node times.

        Args:
            repeat: Node-by-node runs of the uncompiled graph to take the best of.

        Returns:
            See :func:`jointlab.analysis.step.kernel_timing.module_timings`.
        """
        return module_timings(self, repeat)

    def __repr__(self) -> str:
        """Granularity and where the stepper stands."""
        where = "done" if self.done else f"at {self.position}: {self.current}"
        return (f"CompiledStepper(granularity={self.granularity!r}, {len(self.kernels)} kernel "
                f"calls, {where})")
