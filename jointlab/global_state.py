"""Torch's process-wide settings a joint graph may depend on, and when each one does.

A setting matters to a graph only if tracing read it and the choice it made is
baked into the graph. Most settings are read by a kernel every time it runs
(deterministic algorithms, float32 matmul precision, oneDNN's and cuDNN's
algorithm choices): the graph's ATen ops dispatch again on every run and
follow them exactly as eager does, so they are not guarded. Others are read
while the trace decomposes an op into the kernels it picks, and the pick is
baked: the SDPA backend flags (flash, math... chosen by ``F.scaled_dot_product_attention``
and recorded as ``aten._scaled_dot_product_flash_attention_for_cpu`` or as the
math path), oneDNN for CPU LSTMs (``aten.mkldnn_rnn_layer``), the default dtype
where the graph creates a tensor without naming its dtype.

:data:`SETTINGS` is the table: each :class:`GlobalSetting` has its name (the
``attr`` of the ``"global"`` fact in ``joint.guards``), its reader, its
predicate (does this setting matter for this graph, given its value at trace
time) and one doc line. :func:`relevant` is what the tracer keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from jointlab.errors import UnsupportedTorchError
from jointlab.torch_compat import is_op_overload, op_schema

__all__ = ["GlobalSetting", "SETTINGS", "advice", "read_all", "relevant", "uses_default_dtype"]

#: The predicate of a setting: ``(graph, value at trace time) -> it matters``.
Predicate = Callable[[fx.GraphModule, Any], bool]


@dataclass(frozen=True)
class GlobalSetting:
    """One process-wide torch setting, how to read it and when a graph depends on it.

    Attributes:
        name: The setting's name in ``joint.guards`` (``"sdpa flash"``).
        read: Reads the setting now, as plain Python data.
        matters: Whether a graph depends on it, given its value at trace time.
        doc: One line: what the setting is and why (or when) the graph bakes it.
        how: How a user sets it, for the refusal's advice.
    """

    name: str
    read: Callable[[], Any]
    matters: Predicate
    doc: str
    how: str


# -- what a graph holds ---------------------------------------------------------------
def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def _op(node: fx.Node) -> str:
    """A call's op name without namespace or overload (``_safe_softmax``); "" otherwise."""
    if node.op != "call_function":
        return ""
    return getattr(node.target, "__name__", "").split(".")[0]


def _devices(nodes: Any) -> set[str]:
    return {t.device.type for n in nodes for t in _tensors(n.meta.get("val"))}


def _sdpa_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """SDPA kernels the dispatcher chose: a fused kernel, or the math path (``_safe_softmax``).

    On the meta device SDPA always takes the math path, whatever the flags: not listed.
    """
    nodes = [n for n in gm.graph.nodes if _op(n).startswith("_scaled_dot_product")
             or _op(n) in ("scaled_dot_product_attention", "_safe_softmax")]
    return [n for n in nodes if _devices([n]) - {"meta"}]


def _sdpa_on(*devices: str) -> Predicate:
    """SDPA kernels on one of ``devices`` (any device but CPU and meta: ``"other"``)."""
    def matters(gm: fx.GraphModule, _traced: Any) -> bool:
        found = _devices(_sdpa_nodes(gm)) - {"meta"}
        return bool(found & set(devices)) or ("other" in devices and bool(found - {"cpu"}))
    return matters


def _sdpa_math_in_half(gm: fx.GraphModule, _traced: Any) -> bool:
    """The math path in a graph holding float16/bfloat16 values (it upcasts them or not)."""
    if not any(_op(n) == "_safe_softmax" for n in _sdpa_nodes(gm)):
        return False
    return any(t.dtype in (torch.float16, torch.bfloat16)
               for n in gm.graph.nodes for t in _tensors(n.meta.get("val")))


def _mkldnn_rnn(gm: fx.GraphModule, traced: Any) -> bool:
    """oneDNN's LSTM layer in the graph, or oneDNN off when traced.

    With oneDNN off an LSTM takes the composite path, which leaves no mark in the graph.
    """
    return traced is False or any(_op(n) == "mkldnn_rnn_layer" for n in gm.graph.nodes)


def _on_cuda(gm: fx.GraphModule, _traced: Any) -> bool:
    return bool(_devices(gm.graph.nodes) - {"cpu", "meta"})


def _when_off(_gm: fx.GraphModule, traced: Any) -> bool:
    """Off when traced: a fast path the trace would have refused may be taken now."""
    return traced is False


def _always(_gm: fx.GraphModule, _traced: Any) -> bool:
    return True


def _never(_gm: fx.GraphModule, _traced: Any) -> bool:
    return False


def _explicit_dtype(node: fx.Node) -> bool:
    if node.kwargs.get("dtype") is not None:
        return True
    schema = op_schema(node.target)
    names = [a.name for a in schema.arguments] if schema is not None else []
    i = names.index("dtype") if "dtype" in names else len(node.args)
    return i < len(node.args) and node.args[i] is not None


def _float(value: Any) -> bool:
    return any(t.is_floating_point() or t.is_complex() for t in _tensors(value))


def _from_default(node: fx.Node, default: str) -> bool:
    """Whether ``node`` made a floating tensor whose dtype came from the default dtype."""
    if node.op == "get_attr":  # a literal (torch.tensor(1.5)) baked with the default dtype
        value = getattr(node.graph.owning_module, str(node.target), None)
        return isinstance(value, torch.Tensor) and str(value.dtype) == f"torch.{default}"
    if node.op != "call_function" or not is_op_overload(node.target):
        return False
    if not _float(node.meta.get("val")) or _explicit_dtype(node):
        return False  # a floating input decides the dtype by promotion, not the default
    return not any(_float(a.meta.get("val")) for a in node.all_input_nodes)


def uses_default_dtype(gm: fx.GraphModule, traced: Any) -> bool:
    """Whether ``gm`` creates a floating tensor whose dtype came from the default dtype.

    A factory without a dtype (``torch.ones(3)``, ``torch.rand``), an op turning only
    integer or bool tensors into floats (``torch.arange(3) * 0.5``), or a literal
    constant of the default dtype. Python code reading ``torch.get_default_dtype()``
    and naming the result is not seen.

    Args:
        gm: The traced graph.
        traced: The default dtype at trace time (``"float32"``).

    Returns:
        True when the graph depends on the default dtype.
    """
    return any(_from_default(n, str(traced)) for n in gm.graph.nodes)


# -- readers ----------------------------------------------------------------------------
def _autocast(device: str) -> Callable[[], Any]:
    def read() -> Any:
        if not torch.is_autocast_enabled(device):
            return False
        return str(torch.get_autocast_dtype(device)).replace("torch.", "")
    return read


def _priority_order() -> Any:
    from torch.nn.attention import SDPBackend

    try:
        from jointlab.torch_compat import sdp_priority_order
    except UnsupportedTorchError:  # a torch without the order: nothing to read
        return None
    return ", ".join(SDPBackend(i).name for i in sdp_priority_order())


_CUDA = torch.backends.cuda
_SDPA_HOW = ("torch.nn.attention.sdpa_kernel(...) around the run, or "
             "torch.backends.cuda.enable_{}_sdp(...)")

#: Every process-wide setting jointlab knows, with when a graph depends on it.
SETTINGS: tuple[GlobalSetting, ...] = (
    GlobalSetting("autocast[cpu]", _autocast("cpu"), _always,
                  "CPU autocast decides the casts the trace records", "torch.autocast('cpu')"),
    GlobalSetting("autocast[cuda]", _autocast("cuda"), _always,
                  "CUDA autocast decides the casts the trace records", "torch.autocast('cuda')"),
    GlobalSetting("default dtype", lambda: str(torch.get_default_dtype()).replace("torch.", ""),
                  uses_default_dtype, "the dtype of tensors created without one (factories, "
                  "int-to-float ops, literals): baked where the graph creates one",
                  "torch.set_default_dtype(...)"),
    GlobalSetting("deterministic algorithms", torch.are_deterministic_algorithms_enabled,
                  _on_cuda, "kernels read it as they run; torch's Python picks other ops by it "
                  "only off CPU (interpolate, pad, max_pool3d)",
                  "torch.use_deterministic_algorithms(...)"),
    GlobalSetting("float32 matmul precision", torch.get_float32_matmul_precision, _never,
                  "read by the matmul kernels as they run: the graph follows it as eager does",
                  "torch.set_float32_matmul_precision(...)"),
    GlobalSetting("fused attention fast path",
                  lambda: bool(torch.backends.mha.get_fastpath_enabled()), _when_off,
                  "MultiheadAttention/TransformerEncoder fast path: a trace that would take it "
                  "is refused, so only a trace with it off bakes the slow path",
                  "torch.backends.mha.set_fastpath_enabled(...)"),
    GlobalSetting("sdpa flash", _CUDA.flash_sdp_enabled, _sdpa_on("cpu", "cuda", "other"),
                  "SDPA's flash kernel allowed (CPU's too): the trace records the kernel chosen",
                  _SDPA_HOW.format("flash")),
    GlobalSetting("sdpa math", _CUDA.math_sdp_enabled, _sdpa_on("cpu", "cuda", "other"),
                  "SDPA's math path allowed: the trace records the kernel chosen",
                  _SDPA_HOW.format("math")),
    GlobalSetting("sdpa mem_efficient", _CUDA.mem_efficient_sdp_enabled,
                  _sdpa_on("cuda", "other"), "SDPA's memory-efficient kernel allowed (not "
                  "read on CPU)", _SDPA_HOW.format("mem_efficient")),
    GlobalSetting("sdpa cudnn", _CUDA.cudnn_sdp_enabled, _sdpa_on("cuda", "other"),
                  "SDPA's cuDNN kernel allowed (not read on CPU)", _SDPA_HOW.format("cudnn")),
    GlobalSetting("sdpa priority order", _priority_order, _sdpa_on("cuda", "other"),
                  "the order SDPA tries its kernels in (CPU's is fixed)",
                  "torch.nn.attention.sdpa_kernel(..., set_priority=True)"),
    GlobalSetting("sdpa math fp16/bf16 reduction", _CUDA.fp16_bf16_reduction_math_sdp_allowed,
                  _sdpa_math_in_half, "whether SDPA's math path upcasts float16/bfloat16",
                  "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(...)"),
    GlobalSetting("mkldnn enabled", lambda: bool(torch.backends.mkldnn.enabled), _mkldnn_rnn,
                  "oneDNN on: CPU LSTMs are traced as its LSTM layer, off: as LSTM cells",
                  "torch.backends.mkldnn.flags(enabled=...) or torch.backends.mkldnn.enabled"),
    GlobalSetting("cudnn enabled", lambda: bool(torch.backends.cudnn.enabled), _on_cuda,
                  "cuDNN on: CUDA RNNs and batch norm are traced as its kernels",
                  "torch.backends.cudnn.flags(enabled=...) or torch.backends.cudnn.enabled"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def read_all() -> dict[str, Any]:
    """Every setting of :data:`SETTINGS`, as it is now, by name."""
    return {s.name: s.read() for s in SETTINGS}


def relevant(name: str, gm: fx.GraphModule, traced: Any) -> bool:
    """Whether the setting ``name`` matters for ``gm`` (unknown names do, to be safe).

    Args:
        name: A setting's name (:attr:`GlobalSetting.name`).
        gm: The traced graph.
        traced: The setting's value at trace time.

    Returns:
        True when the graph bakes a choice the setting made.
    """
    setting = _BY_NAME.get(name)
    return setting is None or setting.matters(gm, traced)


def advice(name: str, traced: Any) -> str:
    """What to do when ``name`` differs from its traced value ``traced``, in words."""
    setting = _BY_NAME.get(name)
    how = f" ({setting.how})" if setting is not None else ""
    return (f"The graph baked the choice torch's {name} made when traced ({traced!r}): set it "
            f"back to {traced!r}{how} to run this graph, or call jl.trace again under the "
            "new setting.")
