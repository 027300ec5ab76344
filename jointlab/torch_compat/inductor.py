"""Guarded accessors for Inductor's internals: provenance, the wrapper's globals, codegen hooks.

What Inductor records about which FX nodes each kernel came from, the
globals of its generated wrapper, and one codegen hook that completes that
provenance around pattern replacements (the only place jointlab writes meta
on nodes it did not create: Inductor's own post-grad nodes). And the one quiet
import of ``torch.utils.cpp_extension`` Inductor's CPU backend needs.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab.torch_compat._base import release, required, torch_attr, unsupported

#: Whether Inductor compiling with ``fallback_random`` draws the numbers eager draws from
#: the same seed. torch 2.13 does; torch 2.11's compiled code draws other numbers (a make_fx
#: graph's ``bernoulli_`` on the CPU: tests/test_random_ops.py), so values downstream of a
#: random op cannot be compared there.
FALLBACK_RANDOM_DRAWS_EAGER = release(torch.__version__) >= (2, 13, 0)

#: What ``torch.utils.cpp_extension`` logs on import under a CUDA build without a GPU.
NO_CUDA_RUNTIME = "No CUDA runtime is found"


def _not_the_cuda_home_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(NO_CUDA_RUNTIME)


def import_cpp_extension_quietly() -> None:
    """Import ``torch.utils.cpp_extension`` once, without its CUDA_HOME note on a CPU host.

    Inductor's CPU backend imports it to build C++. A CUDA build of torch on a
    machine without a GPU (Colab's CPU runtime) logs "No CUDA runtime is found,
    using CUDA_HOME=..." to stderr at that import: true, and beside the point of a
    CPU compile, yet a student reads it as an error. Only that one record is
    dropped, only during this import, and only when no CUDA device is usable.
    """
    name = "torch.utils.cpp_extension"
    if name in sys.modules or torch.cuda.is_available():
        return
    logger = logging.getLogger(name)
    logger.addFilter(_not_the_cuda_home_note)
    try:
        importlib.import_module(name)
    finally:
        logger.removeFilter(_not_the_cuda_home_note)


def inductor_provenance(compiled: Callable[..., Any]) -> tuple[dict[str, Any], str]:
    """Inductor's kernel provenance and output code for a ``torch._inductor.compile`` result.

    Inductor (``trace.provenance_tracking_level=1``) leaves, on the callable it
    returns, a JSON mapping between the graph it was given ("pre-grad" nodes),
    its post-grad nodes and its kernels (``preToPost``, ``postToPre``,
    ``cppCodeToPost``, ``postToCppCode``), and the generated Python wrapper code.

    Args:
        compiled: What ``torch._inductor.compile`` returned.

    Returns:
        ``(mapping, source code)``.

    Raises:
        UnsupportedTorchError: This torch leaves no such attributes.
    """
    text = getattr(compiled, "inductor_provenance_mapping_str", None)
    source = getattr(compiled, "source_code", None)
    if not isinstance(text, str) or not text or not isinstance(source, str):
        raise unsupported("inductor_provenance_mapping_str/source_code on compiled graphs",
                          "map Inductor's kernels onto the joint graph")
    return json.loads(text), source


def inductor_wrapper_globals(compiled: Callable[..., Any]) -> dict[str, Any]:
    """The module namespace of a ``torch._inductor.compile`` result's generated wrapper code.

    Its ``call`` runs the kernels; its globals hold the loaded kernels
    (``cpp_fused_*``, ``extern_kernels``, ``reinterpret_tensor``...).

    Args:
        compiled: What ``torch._inductor.compile`` returned.

    Returns:
        The generated module's globals.

    Raises:
        UnsupportedTorchError: This torch keeps no ``current_callable`` with module globals.
    """
    call = getattr(compiled, "current_callable", None)
    func = getattr(call, "__func__", call)
    namespace = getattr(func, "__globals__", None)
    if not isinstance(namespace, dict) or "call" not in namespace:
        raise unsupported("current_callable of compiled graphs (the generated wrapper's call)",
                          "step the kernels of a compiled joint graph")
    return namespace


def inductor_lifted_args(gm: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors ``torch._inductor.compile(gm, ...)`` passes its generated code before the args.

    Inductor compiles a graph module through ``aot_module_simplified``, which
    lifts the module's parameters and buffers (``remove_duplicate=False``, in
    that order) to inputs: the callable it returns prepends them to each call's
    args. A traced graph's baked tensor constants (``_tensor_constant0``: a
    captured tensor, HF's empty KV-cache keys) are such buffers once the graph
    is copied into a ``GraphModule``. Code that calls the generated wrapper's
    ``call`` directly must prepend them the same way.

    Args:
        gm: The module given to ``torch._inductor.compile``.

    Returns:
        The lifted tensors, in the order the generated ``call`` unpacks them.
    """
    params = dict(gm.named_parameters(remove_duplicate=False))
    buffers = dict(gm.named_buffers(remove_duplicate=False))
    return [*params.values(), *buffers.values()]


# -- completing Inductor's provenance around pattern replacements -----------------
_ABSORBED = "jointlab_absorbed"  # the pass name on the provenance jointlab adds


def _replacements(graph: torch.fx.Graph, outputs: list[Any]) -> list[Any]:
    """Nodes of ``graph`` whose provenance names one of ``outputs`` (a replaced match output)."""
    gid, names = id(graph), {o.name for o in outputs}
    return [n for n in graph.nodes
            if any(s.name in names and s.graph_id == gid for s in n.meta.get("from_node", ()))]


def _recording_erase(original: Callable[..., Any], node_source: Any,
                     action: Any) -> Callable[..., Any]:
    def erase_nodes(match: Any) -> None:
        graph = match.graph
        outputs = [o for o in match.output_nodes() if o is not None and not o.users]
        original(match)
        alive = set(graph.nodes)
        absorbed = [n for n in match.nodes if n not in alive and n not in outputs
                    and n.op == "call_function"]
        if not absorbed or not outputs:
            return
        for new in _replacements(graph, outputs):
            new.meta["from_node"] = [*new.meta.get("from_node", ()),
                                     *(node_source(a, _ABSORBED, action) for a in absorbed)]
    return erase_nodes


#: Ops whose own value is a copy: a buffer that copies for one of them computes that node.
_COPY_OPS = frozenset({"clone", "copy", "copy_", "_to_copy", "contiguous", "alias",
                       "lift_fresh_copy"})


def layout_copy_source(buf: Any) -> str | None:
    """The buffer a layout copy reads, for a buffer Inductor added to change a layout.

    Inductor realizes a copy (``ExternKernel.copy_input``, ``require_stride_order``)
    where a kernel needs another layout than a value has (a channels-last copy of
    a conv weight); the copy carries the origins of the op that needed it, so
    the kernel writing it is credited with that op's whole fused chain. Such a
    buffer is a pointwise computation that only loads one buffer, made for no
    copy op of the graph, into memory of its own (not a slice of a ``cat``).

    Returns:
        The name of the one buffer it loads, or None for any other buffer.
    """
    data = getattr(buf, "data", None)
    if type(data).__name__ != "Pointwise" or not hasattr(data, "inner_fn_opcount"):
        return None
    if type(getattr(buf, "layout", None)).__name__ == "NonOwningLayout":
        return None  # writes a slice of another buffer (a cat's part): that node's value
    origin = getattr(buf, "origin_node", None)
    target = getattr(origin, "target", None)
    if origin is not None and getattr(target, "__name__", "").split(".")[0] in _COPY_OPS:
        return None
    try:
        count = data.inner_fn_opcount()
    except Exception:  # noqa: BLE001 - an IR node we cannot evaluate: not a known copy
        return None
    reads = list(dict.fromkeys(count.read_buffers))
    return reads[0] if set(count.used_ops) <= {"load"} and len(reads) == 1 else None


def buffer_origin_names(buf: Any) -> tuple[str, ...] | None:
    """The post-grad nodes a buffer of the generated code was made for (Inductor's ``origins``).

    A fused kernel's provenance is the union of the ``origins`` of the buffers it
    writes, so these say which of a kernel's nodes each buffer brought in.

    Returns:
        The node names, or None where the buffer keeps no readable ``origins``.
    """
    getter = getattr(buf, "get_origins", None)
    try:
        origins = getter() if callable(getter) else getattr(buf, "origins", None)
        return None if origins is None else tuple(o.name for o in origins)
    except Exception:  # noqa: BLE001 - an IR node without origins: unknown, not empty
        return None


def _recording_codegen(original: Callable[..., Any], lowered: list[Any],
                       record: dict[str, Any]) -> Callable[..., Any]:
    copies, origins = record["copies"], record["origins"]

    def codegen(graph: Any) -> Any:
        out = original(graph)
        names = {}
        for buf in graph.buffers:
            origin = getattr(buf, "origin_node", None)
            if origin is not None:
                names[buf.get_name()] = origin.name
            source = layout_copy_source(buf)
            if source is not None:
                copies[buf.get_name()] = source
            made_for = buffer_origin_names(buf)
            if made_for is not None:
                origins[buf.get_name()] = made_for
        lowered.append((graph.module, names))
        return out
    return codegen


@contextlib.contextmanager
def complete_inductor_provenance() -> Iterator[dict[str, Any]]:
    """Inductor options and patches under which a compile records its full provenance.

    Inductor's pattern replacements (``mm`` + ``add`` -> ``addmm``, ...) record
    only the match's output node as the source of the replacement; the other
    nodes they consume vanish from ``trace.provenance_tracking_level=1``'s
    mapping (the tied-weight gradient ``mm`` of a GPT became part of an
    ``addmm`` nobody said covered it). While this context is open, each match
    that erases such nodes adds them, as provenance with pass name
    ``jointlab_absorbed``, to the nodes that replaced its outputs, so Inductor's
    own mapping carries them on to the kernel. Each lowering also leaves the
    graph it lowered (post-grad, after decompositions and pattern passes) and
    which of its nodes each buffer of the generated code holds (Inductor's
    best-effort ``origin_node``). The yielded options turn the FX-graph cache
    off: a cached compile lowers nothing, so it would leave neither record.

    Yields:
        ``{"options": Inductor options to compile with, "lowered": [(post-grad
        graph module, {buffer name: its node's name}), ...], "copies": {layout-copy
        buffer: the buffer it copies}, "origins": {buffer: the post-grad node names
        it was made for}}`` (see :func:`layout_copy_source`, :func:`buffer_origin_names`).

    Raises:
        UnsupportedTorchError: This torch lacks the pattern matcher's ``Match``,
            ``NodeSource`` or ``GraphLowering.codegen``.
    """
    purpose = "map the nodes Inductor's pattern replacements consume onto their kernels"
    match_cls = torch_attr("torch._inductor.pattern_matcher", "Match", purpose)
    lowering = torch_attr("torch._inductor.graph", "GraphLowering", purpose)
    node_source = torch_attr("torch.fx.traceback", "NodeSource", purpose)
    action = torch_attr("torch.fx.traceback", "NodeSourceAction", purpose).REPLACE
    erase = required(match_cls, "erase_nodes", "Match.erase_nodes", purpose)
    codegen = required(lowering, "codegen", "GraphLowering.codegen", purpose)
    record: dict[str, Any] = {"options": {"fx_graph_cache": False}, "lowered": [], "copies": {},
                              "origins": {}}
    match_cls.erase_nodes = _recording_erase(erase, node_source, action)
    lowering.codegen = _recording_codegen(codegen, record["lowered"], record)
    try:
        yield record
    finally:
        match_cls.erase_nodes = erase
        lowering.codegen = codegen
