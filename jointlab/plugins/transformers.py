"""The transformers plug-in: everything jointlab does for Hugging Face models, in one file.

It registers two rows of the watch table (:mod:`jointlab.trace.watch_table`),
entered around every trace: "transformers refusals" (:func:`hf_refusals`) and
"transformers branches" (:func:`hf_exact_branches`, and in mode="aot"
:func:`hf_tracing_compat`). Without this plug-in the tracer still traces any
model; transformers' models then fail as torch fails on them. It also names
the empty constants HF's KV cache puts into a graph (``use_cache=True``:
:data:`KV_CACHE`), in the trace's warning and compile's errors.

**AOT's tracing tensors.** transformers guards its data-dependent shortcuts
(``masking_utils``: "skip the mask when nothing is padded", "no packed sequences") with
``transformers.utils.import_utils.is_tracing(tensor)``, which recognises a
``FakeTensor`` (what make_fx mode hands the model) but not the
``FunctionalTensor`` that the AOT export wraps around it. In mode="aot" those
branches then read tensor values and the export fails with a data-dependent
error. :func:`hf_tracing_compat` fixes only that recognition, and only while the AOT
export runs: every ``is_fake_tensor`` function that transformers' loaded
modules hold (``is_tracing`` looks it up in ``import_utils`` at call time) is
replaced by one that also accepts a ``FunctionalTensor`` whose inner tensor is
a ``FakeTensor``. The originals are put back when the block exits, whatever
happens. This makes transformers take the same branch as in make_fx mode (the
one it takes under ``torch.compile``), whose result equals eager's.

transformers is never imported here: if the user has not imported it, the
patches do nothing, so ``import jointlab`` stays light and other models are
untouched.

**Packed sequences.** :func:`hf_exact_branches` (both modes) makes one of those data-dependent
shortcuts take eager's branch where the trace can prove which branch eager
takes. transformers' packed-sequence check (``find_packed_sequence_indices``)
reads the position ids; while tracing it assumes packing, which materialises a
causal mask, and the mask turns off SDPA's native grouped-query attention
(``repeat_kv`` plus a masked kernel instead of ``enable_gqa`` with
``is_causal``). Same mathematics, other kernels, other rounding: the graph would
not be eager's. When the traced position ids are, by construction, ``arange``
with step 1 (what every decoder builds when the caller passes none), no row is
packed for any input, so the shim answers as eager does. Position ids that
come from anywhere else keep transformers' general branch.

**Mixture of experts.** :func:`hf_refusals` turns the two ways HF's
mixture-of-experts layers fail to trace into refusals that name the implementation that traces
(``experts_implementation="batched_mm"``) and the user's source line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from jointlab import torch_compat
from jointlab.errors import DataDependentError, JointlabError, TraceError
from jointlab.patching import patched
from jointlab.runtime.constants import LibraryConstant
from jointlab.sources import frame_text, innermost_user_frame
from jointlab.trace.probe_hooks import traced_node
from jointlab.trace.watch_table import Watch, WatchCall

__all__ = ["AFTER", "CONSTANTS", "KV_CACHE", "NAME", "ROWS", "experts_implementation",
           "hf_exact_branches", "hf_refusals", "hf_tracing_compat", "is_functional_fake",
           "rows_count_up_by_one"]

_IMPORT_UTILS = "transformers.utils.import_utils"
_NAME = "is_fake_tensor"
_MASKING_UTILS = "transformers.masking_utils"
_PACKED = "find_packed_sequence_indices"


def is_functional_fake(x: Any) -> bool:
    """True when ``x`` is a ``FunctionalTensor`` wrapping a ``FakeTensor`` (AOT tracing).

    Args:
        x: Any value.

    Returns:
        Whether ``x`` is one of the AOT export's tracing tensors.
    """
    if not isinstance(x, torch_compat.FunctionalTensor):
        return False
    inner = torch_compat.from_functional_tensor(x.elem)
    return isinstance(inner, torch_compat.FakeTensor)


def _loaded(module: str, name: str) -> tuple[Any, Callable[..., Any] | None]:
    """transformers' ``module`` if the user has imported it, and its function ``name``."""
    mod = sys.modules.get(module)
    fn = getattr(mod, name, None) if mod is not None else None
    return mod, fn if callable(fn) else None


def _swapped(mods: list[Any], name: str, original: Callable[..., Any],
             replacement: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """``mod.name = replacement`` on each module in the block (``jointlab.patching.patched``)."""
    replacement.__wrapped__ = original  # type: ignore[attr-defined]
    return patched([(mod, name, replacement) for mod in mods])


def _holders(original: Callable[..., Any]) -> list[Any]:
    """transformers' loaded modules that hold ``original`` under its own name."""
    return [mod for name, mod in list(sys.modules.items())
            if (name == "transformers" or name.startswith("transformers."))
            and mod is not None and mod.__dict__.get(_NAME) is original]


@contextlib.contextmanager
def hf_tracing_compat() -> Iterator[None]:
    """Make transformers' ``is_tracing`` recognise the AOT export's tensors in this block.

    Does nothing unless transformers is already imported and has the function.

    Yields:
        Nothing; the patch is active inside the block and removed on exit.
    """
    _utils, original = _loaded(_IMPORT_UTILS, _NAME)
    if original is None:
        yield
        return

    def is_fake_tensor(x: Any) -> bool:
        return bool(original(x)) or is_functional_fake(x)

    with _swapped(_holders(original), _NAME, original, is_fake_tensor):
        yield


# -- data-dependent shortcuts taken as eager takes them ------------------------------------
_ARANGE = ("arange.default", "arange.start", "arange.start_step")
_SAME_ROWS = ("clone.default", "alias.default", "detach.default", "_to_copy.default",
              "lift_fresh_copy.default")
_SHIFT = ("add.Tensor", "sub.Tensor", "add.Scalar", "sub.Scalar")


def _op(node: Any) -> str:
    """``"name.overload"`` of an aten call node, or ``""``."""
    if getattr(node, "op", None) != "call_function":
        return ""
    namespace, name, overload = torch_compat.op_parts(node.target)
    return f"{name}.{overload}" if namespace == "aten" else ""


def _unit_step(node: Any) -> bool:
    """An ``arange`` node whose step is 1 (default, or given as the literal 1)."""
    if _op(node) != "arange.start_step":
        return True
    step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    return isinstance(step, int) and step == 1


def _keeps_last_axis(node: Any) -> bool:
    """A view-like node that leaves its input's last axis the last axis, unchanged."""
    op = _op(node)
    if op in _SAME_ROWS:
        return True
    if op == "unsqueeze.default":
        val = getattr(node.args[0], "meta", {}).get("val")
        dim = node.args[1]
        # a new leading axis, never a new last one
        return isinstance(val, torch.Tensor) and 0 <= dim < val.dim()
    if op == "expand.default":
        size = node.args[1]
        return len(size) > 0 and (size[-1] == -1)
    if op in _SHIFT:  # shifting every element by one number keeps the differences
        return isinstance(node.args[1], (int, float)) and not isinstance(node.args[1], bool)
    return False


def rows_count_up_by_one(node: Any) -> bool:
    """Whether a traced tensor's rows are consecutive integers by construction.

    True for ``arange`` with step 1 seen through leading-axis views, copies and
    shifts by a number: its last axis counts up by exactly one for any sizes.

    Args:
        node: The graph node that produced the tensor (None when unknown).

    Returns:
        Whether every row provably counts up by one.
    """
    while node is not None and _keeps_last_axis(node):
        node = node.args[0]
    return _op(node) in _ARANGE and _unit_step(node)


@contextlib.contextmanager
def hf_exact_branches() -> Iterator[None]:
    """Have transformers' packed-sequence check answer as eager does, where provable.

    Does nothing unless ``transformers.masking_utils`` is already imported.

    Yields:
        Nothing; the patch is active inside the block and removed on exit.
    """
    masking, original = _loaded(_MASKING_UTILS, _PACKED)
    if original is None:
        yield
        return

    def find_packed_sequence_indices(position_ids: Any) -> Any:
        if rows_count_up_by_one(traced_node(position_ids)):
            return None  # eager's answer for rows that count up by one: nothing packed
        return original(position_ids)

    with _swapped([masking], _PACKED, original, find_packed_sequence_indices):
        yield


# -- mixture-of-experts refusals ----------------------------------------------------------
_MOE_DISPATCH = os.path.join("transformers", "integrations", "moe.py")
_WORKS = "batched_mm"
_HOW = (
    f'Build the model with experts_implementation="{_WORKS}", which traces: '
    f'AutoModelForCausalLM.from_config(config, experts_implementation="{_WORKS}") '
    f'(or from_pretrained(..., experts_implementation="{_WORKS}")), or pass '
    f'experts_implementation="{_WORKS}" to the model\'s config.'
)


def experts_implementation(model: nn.Module) -> str | None:
    """The HF experts implementation ``model`` dispatches to, or None if it has none."""
    for mod in model.modules():
        impl = getattr(getattr(mod, "config", None), "_experts_implementation", None)
        if isinstance(impl, str):
            return impl
    return None


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """Frames of ``exc`` and of the exceptions it was raised from, outermost first."""
    out: list[traceback.FrameSummary] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.extend(traceback.extract_tb(exc.__traceback__))
        exc = exc.__cause__ or exc.__context__
    return out


def _is_hf_file(path: str) -> bool:
    return f"{os.sep}transformers{os.sep}" in path


def _through_experts(frames: list[traceback.FrameSummary]) -> bool:
    return any(f.filename.endswith(_MOE_DISPATCH) for f in frames)


def _user_line(frames: list[traceback.FrameSummary]) -> str:
    """`` at file:line: code`` of the innermost frame of the user's own code."""
    frame = innermost_user_frame(frames, also_skip=_is_hf_file)
    return f" (called at {frame_text(frame)})" if frame is not None else ""


def _hf_line(frames: list[traceback.FrameSummary]) -> str:
    """`` in file:line`` of the innermost transformers frame."""
    hf = [f for f in frames if _is_hf_file(f.filename)]
    return f" in {hf[-1].filename}:{hf[-1].lineno}" if hf else ""


@contextlib.contextmanager
def hf_refusals(model: nn.Module) -> Iterator[None]:
    """Re-raise HF mixture-of-experts tracing failures with what to do instead.

    Args:
        model: The model being traced.

    Yields:
        Nothing; failures inside the block are translated.

    Raises:
        TraceError: ``grouped_mm`` experts: torch's shape inference rejects the op.
        DataDependentError: ``eager`` experts: the loop over experts reads data.
    """
    try:
        yield
    except DataDependentError as exc:
        frames = _frames(exc)
        if experts_implementation(model) != "eager" or not _through_experts(frames):
            raise
        raise DataDependentError(
            f"{exc} The model uses HF's eager experts loop (experts_implementation="
            f'"eager"), which picks the experts to run from the routing values'
            f"{_user_line(frames)}. {_HOW}") from exc
    except RuntimeError as exc:
        impl = experts_implementation(model)
        frames = _frames(exc)
        if isinstance(exc, JointlabError) or impl in (None, _WORKS) or not _through_experts(frames):
            raise
        raise TraceError(
            f'the experts layer (experts_implementation="{impl}") cannot be traced: '
            f"torch's shape inference for it failed{_hf_line(frames)} with: {exc}"
            f"{_user_line(frames)}. {_HOW}"
        ) from exc


# -- the plug-in's rows ----------------------------------------------------------------
@contextlib.contextmanager
def _branches_as_eager(call: WatchCall) -> Iterator[None]:
    """transformers' data-dependent checks answered as eager answers them, for one trace."""
    with contextlib.ExitStack() as stack:
        if call.mode == "aot":  # the export wraps fake tensors in FunctionalTensor
            stack.enter_context(hf_tracing_compat())
        stack.enter_context(hf_exact_branches())
        yield


NAME = "transformers"
#: The table row the plug-in's rows follow.
AFTER = "optimizer and parameter misuse"
ROWS: tuple[Watch, ...] = (
    Watch("transformers refusals", "an HF MoE path jointlab cannot trace exactly", "refuse",
          TraceError, "named with the model's class and the fix",
          lambda c: hf_refusals(c.model)),
    Watch("transformers branches", "transformers' packed-sequence check while tracing; in "
          "mode='aot', its is_tracing check", "swap", None,
          "answered as eager answers it, so the same kernels are traced; in mode='aot' "
          "is_fake_tensor is also patched to accept AOT's FunctionalTensor (hf_tracing_compat)",
          _branches_as_eager),
)


def _made_by_hf_cache(stack_trace: str) -> bool:
    return "cache_utils.py" in stack_trace or "cache.update(" in stack_trace


#: The empty key/value tensors HF's cache concatenates onto (``use_cache=True``).
KV_CACHE = LibraryConstant("HF's KV cache: use_cache=True", _made_by_hf_cache,
                           "the model fills a KV cache",
                           "pass use_cache=False to the model call in train_fn")
CONSTANTS = (KV_CACHE,)
