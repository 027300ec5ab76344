"""The joint graph compiled by Inductor directly, and what the compile recorded.

:class:`InductorGraph` is what ``joint.compile("inductor")`` runs for a
static-shape graph (:mod:`jointlab.analysis.compile`): ``torch._inductor.compile``
on a copy of the traced graph (no Dynamo re-trace), with provenance tracking on,
on its first call. It keeps what the kernel map, the compiled Stepper and
``jl.bisect`` read: provenance, generated code, buffer origins
(:func:`buffer_origins`), lowered graphs, lifted constants and Inductor's state.
:func:`compile_errors` turns torch's errors while compiling into
:class:`jointlab.errors.NodeExecutionError`, naming the baked tensor constants
the failing node depends on (:func:`traced_constants_behind`).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from typing import Any

import torch

from jointlab import torch_compat
from jointlab.analysis.step.kernel_code import KernelPiece, kernel_pieces
from jointlab.errors import CompiledGraphError, JointlabError, NodeExecutionError
from jointlab.runtime.constants import library_constant
from jointlab.runtime.torch_errors import wrap_exception
from jointlab.torch_compat import inductor_provenance
from jointlab.torch_compat.inductor import import_cpp_extension_quietly

# Inductor replaces random ops by its own generator unless told to call the ATen
# ones: with fallback_random the compiled graph draws what eager draws.
EXACT_RANDOM = {"fallback_random": True}
# Inductor records which joint-graph nodes each kernel covers (its provenance).
# Inductor's cache skips the lowering, where the buffer origins the compiled Stepper reads
# are recorded, so the mapped compile always lowers.
_MAPPED = {**EXACT_RANDOM, "trace.provenance_tracking_level": 1, "fx_graph_cache": False}


class InductorGraph:
    """The joint graph compiled by Inductor directly, on its first call.

    Attributes:
        provenance: Inductor's node/kernel mapping (None before the first call).
        source_code: Inductor's generated wrapper and kernels (None before).
        buffers: ``{buffer: (post-grad node, target, shape)}`` recorded while lowering.
        lowered: ``(post-grad graph, {buffer: node})`` per graph Inductor lowered.
        copies: ``{buffer: buffer it copies}`` for the layout copies Inductor added.
        origins: ``{buffer: post-grad nodes it was made for}`` (Inductor's ``origins``).
        lifted: The baked tensor constants Inductor lifted to leading inputs of its
            generated ``call`` (:func:`jointlab.torch_compat.inductor_lifted_args`).
        state: Inductor's configuration, lowerings and decompositions when it
            compiled (None before).
    """

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        """Keep a copy of ``gm`` (same node names); Inductor never edits the traced graph."""
        self.gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        self.fn: Any = None
        self.provenance: dict[str, Any] | None = None
        self.source_code: str | None = None
        self.buffers: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        self.lowered: list[tuple[torch.fx.GraphModule, dict[str, str]]] = []
        self.copies: dict[str, str] = {}
        self.origins: dict[str, tuple[str, ...]] = {}
        self._pieces: list[KernelPiece] | None = None
        self.lifted = torch_compat.inductor_lifted_args(self.gm)
        self.state: torch_compat.InductorState | None = None

    def kernel_pieces(self) -> list[KernelPiece]:
        """The generated wrapper cut per kernel call (:func:`kernel_pieces`), cut once.

        Raises:
            CompiledGraphError: Not compiled yet, or a wrapper that cannot be cut.
        """
        if self._pieces is None:
            if self.source_code is None:
                raise CompiledGraphError("not compiled yet: run the compiled joint once first")
            self._pieces = kernel_pieces(self.source_code)
        return self._pieces

    def code_args(self, args: list[Any]) -> list[Any]:
        """What the generated ``call`` takes for the graph's ``args``: the lifted constants first.

        Calling the compiled module prepends them itself; running the generated
        wrapper's ``call`` (or its pieces) directly needs them prepended here.
        """
        return [*self.lifted, *args]

    def __call__(self, *args: Any) -> Any:
        """Compile for these inputs on the first call, then run the compiled code."""
        if self.fn is None:
            self.state = torch_compat.inductor_state()  # what jl.bisect recompiles under
            import_cpp_extension_quietly()  # no "No CUDA runtime" note on a CPU host
            with torch.no_grad(), torch_compat.complete_inductor_provenance() as record, \
                    compile_errors(self.gm):
                fn = torch_compat.inductor_compile(self.gm, list(args),
                                                   options={**_MAPPED, **record["options"]})
            self.provenance, self.source_code = inductor_provenance(fn)
            self.lowered = record["lowered"]
            self.copies = record["copies"]
            self.origins = record["origins"]
            self.buffers = buffer_origins(self.lowered)
            self.fn = fn
            with contextlib.suppress(CompiledGraphError):  # raised again where pieces are read
                self.kernel_pieces()  # cut once here, not at each Stepper's creation
        return self.fn(*args)


_COMPILE_HINT = ("Inductor re-traces the joint graph under its own decompositions before "
                 "generating code, and torch rejected a node there; the traced graph itself "
                 "runs (joint.run)")


def _failed_node(gm: torch.fx.GraphModule, exc: BaseException) -> torch.fx.Node | None:
    """The node of ``gm`` named in torch's "While executing %name" note, if any."""
    found = re.search(r"While executing %(\w+)", str(exc))
    nodes = {n.name: n for n in gm.graph.nodes}
    return nodes.get(found.group(1)) if found else None


def traced_constants_behind(gm: torch.fx.GraphModule, node: torch.fx.Node | None) -> list[str]:
    """The tensor constants baked into ``gm`` that ``node``'s value depends on."""
    if node is None:
        return []
    seen, todo, out = {node}, [node], []
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    for a in gm.graph.find_nodes(op="get_attr"):
        if a in seen and isinstance(getattr(gm, str(a.target), None), torch.Tensor):
            kind = library_constant(gm, a)
            out.append(f"{a.target} ({kind.label}; {kind.fix})" if kind else str(a.target))
    return out


@contextlib.contextmanager
def compile_errors(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Raise torch's errors while Inductor compiles ``gm`` as NodeExecutionError.

    The message names the traced tensor constants the failing node depends on,
    when there are any (a KV cache's empty keys, a captured tensor).
    """
    try:
        yield
    except JointlabError:
        raise
    except Exception as exc:
        consts = traced_constants_behind(gm, _failed_node(gm, exc))
        hint = _COMPILE_HINT + (
            "; the failing node depends on tensor constants the trace baked into the graph: "
            + ", ".join(consts) + ". Pass them as inputs (or as said next to one), and trace "
            "again" if consts else "")
        raise wrap_exception(exc, "Inductor's compile of the joint graph",
                             NodeExecutionError, hint) from exc


def _static_shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, torch.Tensor):
        return None  # a multi-output node: no one buffer shape
    try:
        return tuple(int(d) for d in value.shape)
    except (TypeError, ValueError):  # symbolic sizes
        return None


def buffer_origins(lowered: list[tuple[torch.fx.GraphModule, dict[str, str]]]
                   ) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """Per generated-code buffer: its post-grad node's name, target (as text) and shape.

    Args:
        lowered: What :func:`jointlab.torch_compat.complete_inductor_provenance`
            recorded: per lowered graph, which node each buffer holds.

    Returns:
        ``{buffer: (node name, str(target), static shape)}``; buffers of nodes
        without one static tensor shape are left out.
    """
    out = {}
    for gm, names in lowered:
        nodes = {n.name: n for n in gm.graph.nodes}
        for buf, name in names.items():
            node = nodes.get(name)
            shape = _static_shape(node.meta.get("val")) if node is not None else None
            if shape is not None:
                out[buf] = (name, str(node.target), shape)
    return out
