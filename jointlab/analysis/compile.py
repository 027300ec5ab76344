"""``joint.compile()``: the joint graph run through ``torch.compile``, as a :class:`CompiledJoint`.

A :class:`CompiledJoint` has a small, explicit surface: :meth:`~CompiledJoint.run`
(one training step through the compiled code), :meth:`~CompiledJoint.compare`
(compiled vs graph vs eager), :attr:`~CompiledJoint.source` (the traced graph it
came from) and a short repr. It does not pass itself off as the traced graph:
stepping, the memory picture and the node table describe the traced graph,
not the code ``torch.compile`` generates, so ``compiled.memory()`` and
``compiled.nodes`` refuse with :class:`jointlab.errors.CompiledGraphError` and
point at ``compiled.source``. ``jl.Stepper(compiled, ...)`` steps the compiled
code itself, kernel by kernel
(:class:`jointlab.analysis.step.compiled.CompiledStepper`).

With ``backend="inductor"`` on a static-shape graph the joint graph is handed to
Inductor directly (``torch._inductor.compile``, no Dynamo re-trace), with
provenance tracking on, so the graph Inductor sees is the traced graph itself,
node names included. Its kernels can then be mapped back onto the joint graph's
nodes (:mod:`jointlab.analysis.kernels`). Dynamic-shape graphs still go
through ``torch.compile`` (and have no kernel map). The Inductor-direct graph
is :class:`jointlab.analysis.inductor_graph.InductorGraph`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from jointlab import torch_compat
from jointlab.analysis.bisect import Bisection, bisect
from jointlab.analysis.compare.compare import Comparison, compare
from jointlab.analysis.compare.judge import Tolerance
from jointlab.analysis.inductor_graph import EXACT_RANDOM, InductorGraph
from jointlab.analysis.kernel_probe import KernelCheck, first_diverging_kernel
from jointlab.analysis.kernels import KernelCoverage, kernel_coverage, kernel_layer, kernel_table
from jointlab.core import RunResult, TracedGraph
from jointlab.errors import CompiledGraphError

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from jointlab.analysis.repro import Repro

__all__ = ["CompiledJoint", "compile_joint", "refuse_compiled_joint"]


def is_static(source: TracedGraph) -> bool:
    """True when ``source`` was traced without dynamic dimensions."""
    return not getattr(source, "dynamic_dims", None)


# -- compiled execution ----------------------------------------------------------
class CompiledJoint:
    """A joint graph whose :meth:`run` goes through ``torch.compile``.

    Attributes:
        source: The traced joint graph it was compiled from (step and analyse this one).
        backend: The ``torch.compile`` backend name.
        compiled: The compiled callable (compilation happens on the first run).
    """

    def __init__(self, source: TracedGraph, backend: str) -> None:
        """Wrap ``source``; compilation happens on the first :meth:`run`."""
        self.source = source
        self.backend = backend
        self._state: torch_compat.InductorState | None = None
        if backend == "inductor" and is_static(source):
            self.compiled: Any = InductorGraph(source.graph_module)
        else:
            self.compiled = torch.compile(
                source.graph_module, backend=backend,
                options=EXACT_RANDOM if backend == "inductor" else None)

    def run(self, model: nn.Module, inputs: dict[str, Any], *,
            accumulate: bool = False) -> RunResult:
        """Run one step like ``JointGraph.run``, through the compiled graph.

        Args:
            model: The live model (buffer updates land in it, as with ``joint.run``).
            inputs: Keyword inputs with the traced structure.
            accumulate: Also add the gradients into ``param.grad``.

        Returns:
            ``(loss, grads by FQN, loss_dict)``.
        """
        if self._state is None and not isinstance(self.compiled, InductorGraph):
            self._state = torch_compat.inductor_state()  # torch.compile compiles on this run
        return self.source.run_with(self.compiled, model, inputs, accumulate=accumulate)

    @property
    def compiler_state(self) -> torch_compat.InductorState | None:
        """Inductor's configuration, lowerings and decompositions when this compiled (or None).

        :func:`jointlab.bisect` recompiles regions under it, so a bug patched in for
        the compile and undone afterwards is still in what it checks.
        """
        if isinstance(self.compiled, InductorGraph):
            return self.compiled.state
        return self._state

    def compare(self, model: nn.Module, inputs: dict[str, Any], **options: Any) -> Comparison:
        """Compare the compiled code and its source graph with eager autograd in one call.

        Args:
            model: The user's model (never changed).
            inputs: Keyword inputs for the training step.
            **options: More keywords for :func:`jointlab.compare` (``seed``, ``rtol``, ...).

        Returns:
            A :class:`jointlab.Comparison` with one candidate per backend plus ``graph``.
        """
        return compare(self, model, inputs, **options)

    def bisect(self, model: nn.Module, inputs: dict[str, Any], **options: Any) -> Bisection:
        """The first region of the graph whose compiled outputs diverge (:func:`jointlab.bisect`).

        Args:
            model: The live model (not changed).
            inputs: Keyword inputs for the training step.
            **options: More keywords for :func:`jointlab.bisect` (``regions``, ``rtol``, ...).

        Returns:
            A :class:`jointlab.Bisection` (region by region, not kernel by kernel).
        """
        return bisect(self, model, inputs, **options)

    def repro(self, path: str | Path, model: nn.Module, inputs: dict[str, Any], *,
              comparison: Comparison | None = None) -> Repro:
        """Write the smallest region that still diverges as one standalone Python file.

        See :mod:`jointlab.analysis.repro`: ``python path`` (torch only) reruns the
        region's generated code against its ATen ops and exits 1 on the divergence.

        Args:
            path: The Python file to write (inputs go beside it, suffix ``.pt``).
            model: The live model (not changed).
            inputs: Keyword inputs for the training step.
            comparison: This compiled graph's :meth:`compare` result (compared now if None).

        Returns:
            A :class:`jointlab.analysis.repro.Repro`.

        Raises:
            jointlab.errors.ReproError: Nothing diverges, or no region diverges alone.
        """
        from jointlab.analysis.repro import write_repro

        found = comparison if comparison is not None else self.compare(model, inputs)
        return write_repro(self, model, inputs, path, found)

    def kernels(self) -> pd.DataFrame:
        """The kernel table (:func:`jointlab.analysis.kernels.kernel_table`), after a run.

        Returns:
            One row per kernel call; ``attrs["coverage"]`` is the map's coverage.
        """
        return kernel_table(self)

    def coverage(self) -> KernelCoverage:
        """Share of the source graph's compute nodes the kernel map covers, after a run.

        Returns:
            A :class:`jointlab.analysis.kernels.KernelCoverage`.
        """
        return kernel_coverage(self)

    def kernel_layer(self) -> dict[str, str]:
        """``{node: kernel}`` for ``jl.dag_view(compiled.source, layers={"kernel": ...})``.

        Returns:
            Covered node names to their kernel calls (see :func:`kernel_layer`).
        """
        return kernel_layer(self)

    def first_diverging_kernel(self, model: nn.Module, inputs: dict[str, Any],
                               tol: Tolerance, seed: int = 0) -> KernelCheck:
        """Rerun the generated code kernel by kernel against Inductor's post-grad graph.

        ``jl.compare`` calls it when this candidate does not match
        (:func:`jointlab.analysis.kernel_probe.first_diverging_kernel`).

        Args:
            model: The live model (not changed).
            inputs: Keyword inputs for the training step.
            tol: How values are judged.
            seed: RNG seed for both runs.

        Returns:
            A :class:`jointlab.analysis.kernel_probe.KernelCheck`.
        """
        if not isinstance(self.compiled, InductorGraph):
            return KernelCheck(None, 0, (), f"no kernel-by-kernel check for backend="
                               f"{self.backend!r} or a dynamic-shape graph")
        return first_diverging_kernel(self, model, inputs, tol, seed)

    def memory(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: the memory picture describes the traced graph (``compiled.source.memory()``).

        Raises:
            jointlab.errors.CompiledGraphError: Always.
        """
        refuse_compiled_joint(self, "memory()")

    @property
    def nodes(self) -> NoReturn:
        """Refused: the node table describes the traced graph (``compiled.source.nodes``).

        Raises:
            jointlab.errors.CompiledGraphError: Always.
        """
        refuse_compiled_joint(self, "nodes")

    def __repr__(self) -> str:
        """Backend, mode and size of the source graph, in one line."""
        n = len(self.source.graph.nodes)
        mapped = getattr(self.compiled, "provenance", None) is not None
        tail = f"; {self.coverage()}" if mapped else ""
        return (f"CompiledJoint(backend={self.backend!r}, source: {self.source.mode} graph, "
                f"{n} nodes{tail})")


def refuse_compiled_joint(joint: Any, what: str) -> None:
    """Raise when ``joint`` is a :class:`CompiledJoint` (``what`` describes the traced graph).

    Args:
        joint: What the caller was given.
        what: The call, e.g. ``"jl.Stepper"`` or ``"memory()"``.

    Raises:
        jointlab.errors.CompiledGraphError: ``joint`` is compiled.
    """
    if isinstance(joint, CompiledJoint):
        raise CompiledGraphError(
            f"{what} works on the traced joint graph, not on code compiled from it: on a "
            f"CompiledJoint ({joint.backend}) it would describe the uncompiled graph. Pass "
            "compiled.source (the original graph from jl.trace) instead. To look inside the "
            "compiled code, jl.Stepper(compiled, model, inputs) steps it kernel by kernel "
            "(joint.compile('inductor')), and jl.bisect(compiled, model, inputs) "
            "compiles and runs it region by region against the uncompiled graph and names "
            "the first region that diverges. compiled.run(...) and jl.compare(compiled, ...) "
            "run the compiled code.")


def compile_joint(joint: TracedGraph, backend: str = "inductor") -> CompiledJoint:
    """Compile ``joint`` with ``torch.compile``.

    Args:
        joint: The joint graph.
        backend: A ``torch.compile`` backend name (``"inductor"``, ``"aot_eager"``, ...).

    Returns:
        A :class:`CompiledJoint`: ``run``, ``compare`` and ``source``.

    Raises:
        jointlab.errors.CompiledGraphError: ``joint`` is compiled already.
    """
    refuse_compiled_joint(joint, "compile()")
    return CompiledJoint(joint, backend)
