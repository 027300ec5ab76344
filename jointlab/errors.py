"""Exception classes that jointlab raises and users catch.

Every error says what was wrong, where (an input path, a parameter name, a
graph node or a source line) and what to do about it. Each class also derives
from the matching builtin (``ValueError``, ``TypeError``, ``RuntimeError``) so
generic handlers keep working.
"""

from __future__ import annotations

import sys

from jointlab.sources import JOINTLAB_DIR, walk_out

__all__ = [
    "AssumptionError",
    "BakedConstantWarning",
    "CheckpointWarning",
    "CompareError",
    "CompiledGraphError",
    "CompiledModuleError",
    "DataDependentError",
    "DiffError",
    "ExportError",
    "FastPathError",
    "GradientLostError",
    "GuardError",
    "InputMismatchError",
    "InputStructureError",
    "InputTypeError",
    "JointlabError",
    "LossError",
    "MemoryQueryError",
    "MetaAttentionWarning",
    "MetaDeviceError",
    "NoTrainableParametersError",
    "NodeExecutionError",
    "PersistError",
    "PlotArgumentError",
    "RecordError",
    "RendererMissingError",
    "StaleAnalysisError",
    "StateMismatchError",
    "StepperError",
    "TableQueryError",
    "TraceError",
    "TrainFnError",
    "TrainFnMisuseError",
    "UnsupportedCheckpointError",
    "UnsupportedModuleError",
    "UnsupportedRandomOpError",
    "UnsupportedTorchError",
    "UnsupportedWrapperError",
    "UntestedTorchWarning",
    "ValueNotAvailableError",
    "WhatIfError",
]


class JointlabError(Exception):
    """Base class of every error jointlab raises on purpose."""


class InputTypeError(JointlabError, TypeError):
    """An input leaf has a type jointlab cannot place in the graph."""


class InputStructureError(JointlabError, ValueError):
    """The nesting or keys of the inputs differ from what was traced."""


class InputMismatchError(JointlabError, ValueError):
    """A tensor input has a shape, dtype or device the graph was not traced for."""


class GuardError(InputMismatchError):
    """A dynamic-shape guard recorded at trace time rejects the given inputs."""


class LossError(JointlabError, TypeError):
    """``train_fn`` did not return a differentiable scalar loss."""


class NoTrainableParametersError(JointlabError, ValueError):
    """The model has no parameter with ``requires_grad=True``."""


class DataDependentError(JointlabError, RuntimeError):
    """The model branches on, or reads, a tensor's value while tracing."""


class StateMismatchError(JointlabError, ValueError):
    """The model's parameters or buffers differ from those at trace time."""


class AssumptionError(StateMismatchError):
    """The model or torch's settings differ from what the graph was traced under.

    ``joint.guards`` lists every recorded assumption: module ``training`` flags and
    classes, hooks, ``requires_grad``, every attribute and variable the trace read
    (dropout ``p``, an HF ``config.hidden_dropout``, a global) and the process-wide
    settings the graph bakes (autocast...).
    """


class MetaDeviceError(JointlabError, RuntimeError):
    """An operation needs real data but the model lives on the meta device."""


class TraceError(JointlabError, RuntimeError):
    """Tracing failed for a reason not covered by a more specific error."""


class TrainFnMisuseError(TraceError):
    """``train_fn`` stepped an optimizer, wrote a parameter or ran its own backward."""


class TrainFnError(TraceError):
    """``train_fn`` (or the model) raised its own exception while being traced.

    The class raised also derives from the user's exception type (``except
    KeyError`` still catches it); the user's exception is the ``__cause__``.
    """

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class CompiledModuleError(TraceError):
    """The model holds a ``torch.compile``-d module, which cannot be traced through."""


class UnsupportedCheckpointError(TraceError):
    """The model uses a form of gradient checkpointing that cannot be traced exactly."""


class UnsupportedModuleError(TraceError):
    """A module cannot be traced so that the graph computes exactly what eager computes."""


class UnsupportedRandomOpError(TraceError):
    """A random op cannot be traced so that the graph draws exactly what eager draws."""


class UnsupportedTorchError(TraceError):
    """This torch lacks a (private) torch API that jointlab needs; the message names both."""


class FastPathError(TraceError):
    """Eager would run PyTorch's fused inference fast path, which a joint graph cannot hold."""


class NodeExecutionError(JointlabError, RuntimeError):
    """A graph node raised while the joint graph was executing."""


class PersistError(JointlabError, ValueError):
    """A JointGraph cannot be saved, or a file is not a safe jointlab graph archive."""


class TableQueryError(JointlabError, ValueError):
    """A node-table query got an unknown grouping, phase or filter value."""


class ValueNotAvailableError(JointlabError, ValueError):
    """A stepped node's value was not computed yet, or was freed after its last use."""


class CompareError(JointlabError, TypeError):
    """``compare`` was called without what it needs (the training step, a model)."""


class WhatIfError(JointlabError, ValueError):
    """A joint graph cannot be split into forward and backward for ``what_if``."""


class DiffError(JointlabError, ValueError):
    """``jl.diff`` got an invalid option (only one of model/inputs, a bad tolerance or budget)."""


class ExportError(JointlabError, ValueError):
    """``jl.export_figure`` cannot write this object or path (unknown kind, no renderer)."""


class BakedConstantWarning(UserWarning):
    """A value captured from Python was frozen into the joint graph as a constant."""


class CheckpointWarning(UserWarning):
    """Gradient checkpointing is in the model but not in the traced graph's memory picture."""


class UntestedTorchWarning(UserWarning):
    """The installed torch is outside the versions jointlab's test suite was run on."""


class PlotArgumentError(JointlabError, ValueError):
    """A plotting or explorer call got an argument it cannot use (``plot_dag``, ``explore``)."""


class MemoryQueryError(JointlabError, ValueError):
    """``joint.memory()`` got a model without inputs (or the reverse), so it cannot measure."""


class StaleAnalysisError(JointlabError, RuntimeError):
    """The graph was edited after its per-node analysis was computed; call ``joint.recompute()``."""


class RecordError(JointlabError, ValueError):
    """``jl.record`` got an invalid option (a byte budget, a grouping depth)."""


class CompiledGraphError(JointlabError, TypeError):
    """A compiled joint graph (``joint.compile()``) was given where the traced graph is needed.

    Stepping, memory and node tables describe the traced graph, not the code
    ``torch.compile`` generated from it; use ``compiled.source`` for them.
    """


class StepperError(JointlabError, TypeError, ValueError):
    """``jl.Stepper`` got an argument it cannot use.

    The graph, model or inputs are of the wrong kind, or a breakpoint names a
    condition jointlab does not know.
    """


class GradientLostError(TraceError):
    """The traced backward lost gradients: they do not depend on the loss in the graph."""


class MetaAttentionWarning(UserWarning):
    """Attention took the math path (S x S scores) only because the trace ran on meta."""


class UnsupportedWrapperError(TraceError):
    """The model is wrapped in a way jointlab cannot trace (e.g. FSDP2 ``fully_shard``)."""


class RendererMissingError(JointlabError, LookupError):
    """No renderer is registered for the kind of view a result asked for."""


class ReproError(JointlabError, ValueError):
    """``compiled.repro()`` has nothing to reproduce, or no region that still diverges alone."""


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning name the first frame outside jointlab.

    Call it as the argument of ``warnings.warn`` in the function that warns: the
    warning then points at the user's line that called into jointlab, however
    many jointlab frames (public wrappers, passes) lie between.

    Returns:
        1 for the calling function, plus one per jointlab frame above it.
    """
    frame, above = walk_out(sys._getframe(1), lambda path: not path.startswith(JOINTLAB_DIR))
    return above + 1 if frame is not None else above  # all jointlab: the outermost frame


class UnsupportedHookError(TraceError):
    """A parameter's hook cannot be held in the joint graph (a post-accumulate-grad hook).

    Tensor hooks (``p.register_hook``) are traced into the backward; a hook that
    runs after ``p.grad`` is written is not, and tracing refuses it, naming the
    parameter.
    """


__all__ += ["UnsupportedHookError"]  # appended here: the list above is kept by others too


class SideEffectWarning(UserWarning):
    """The traced step changed Python state (a counter, a stash) that the graph does not change.

    The graph repeats ops, not Python: after ``joint.run`` such an attribute keeps
    its value, where each eager step changes it. Tracing put it back; the warning
    names it, its values and the line that wrote it.
    """


__all__ += ["SideEffectWarning"]


class UnsupportedControlFlowError(TraceError):
    """The traced step uses higher-order control flow (``torch.cond`` on a tensor predicate).

    Which branch runs depends on a tensor's value when the step runs; a joint graph
    is one flat list of ATen ops and their backward and cannot hold the branch. The
    message names the line and says how to write it so that it traces exactly.
    """


__all__ += ["UnsupportedControlFlowError"]
