"""What-if partitions: what saving fewer activations would buy.

PyTorch's partitioners (:func:`jointlab.torch_compat.partitioners`) split a joint graph
into a forward graph that saves some values and a backward graph that reads
them. They expect a functional graph with AOT conventions (a ``tangents_*``
placeholder seeding the backward, forward outputs first). An ``aot`` graph
already is one: its descriptors (:mod:`jointlab.runtime.descriptors`) say which
outputs are forward outputs (buffer mutations, the loss, loss_dict values)
and which placeholder is the loss tangent, so it is used as it is. The
make_fx joint graph has neither, so :func:`functional_joint` builds such a copy:

1. the ``ones_like(loss)`` seed becomes a ``tangents_1`` placeholder;
2. outputs are reordered to ``[loss, *loss_dict, *grads]``;
3. ``torch.func.functionalize`` turns ``bernoulli_``/``add_`` into functional
   ops (buffer write-backs are dropped: they do not change memory).

The meta those copies need (the seed's meta on the tangent, the partitioner's
forward tags, jointlab's annotations dropped) is written by
:mod:`jointlab.passes.partition`; the user's graph is only read.

Each option is then scored with :mod:`jointlab.analysis.memory.predict`'s liveness model: the
forward graph runs with the state and inputs live; the backward graph runs
with the state and inputs (the caller holds them) plus the saved values, which
stay alive for the whole backward as autograd's ``saved_tensors`` do. Saved
values that are views of state or inputs cost nothing extra.
"""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import torch
import torch.fx as fx

from jointlab.analysis.memory.predict import predict
from jointlab.errors import WhatIfError
from jointlab.input_grads import graph_input_grads
from jointlab.meta import op_name, storage_owner
from jointlab.passes.analyze import ensure_analyzed, hint
from jointlab.passes.partition import drop_annotations, seed_as_tangent, tag_forward
from jointlab.runtime.descriptors import has_descriptors, outputs_and_tangents
from jointlab.torch_compat import FakeTensorMode, aot_descriptors, make_fx, partitioners

D = aot_descriptors()

TANGENT = "tangents_1"


def is_loss_seed(node: fx.Node, loss: fx.Node) -> bool:
    """True for the ``ones_like(loss)`` node that seeds the backward."""
    return (node.op == "call_function" and op_name(node) == "ones_like"
            and node.args[:1] == (loss,))


def _empty_like_val(v: Any, mode: FakeTensorMode) -> Any:
    # A fake on the value's own device (meta, CPU or CUDA): nothing is allocated.
    if not isinstance(v, torch.Tensor):
        return hint(v) if isinstance(v, torch.SymInt) else v
    shape = [hint(s) for s in v.shape]
    stride = [hint(s) for s in v.stride()]
    with mode:
        return torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device)


def functional_joint(joint: Any) -> tuple[fx.GraphModule, int, list[Any]]:
    """A functional, AOT-convention copy of a joint graph of either mode.

    Args:
        joint: A traced JointGraph (``make_fx`` or ``aot`` mode).

    Returns:
        ``(graph module, number of forward outputs, example args)``. The
        outputs are the forward outputs, then the gradients, in the layout of
        the mode: ``[loss, *loss_dict, *grads in param_names order]`` for
        make_fx, the AOT graph's own output order for aot.

    Raises:
        WhatIfError: The graph has no loss tangent or gradient seed to split at.
    """
    if has_descriptors(joint):
        return _aot_functional_joint(joint)
    if joint.mode == "aot":
        raise WhatIfError(
            "what-if needs the AOT descriptors (meta['desc']) to split this aot-mode graph, "
            "and a loaded graph does not keep them; re-trace with jl.trace(..., mode='aot').")
    return _makefx_functional_joint(joint)


_FORWARD_OUTPUTS = (D.PlainAOTOutput, D.InputMutationAOTOutput)


def _aot_functional_joint(joint: Any) -> tuple[fx.GraphModule, int, list[Any]]:
    src = joint.graph_module
    gm = fx.GraphModule(src, copy.deepcopy(src.graph))
    descs = list(src.graph.output_node().meta.get("desc") or [])
    is_fwd = [isinstance(d, _FORWARD_OUTPUTS) for d in descs]
    k = is_fwd.index(False) if False in is_fwd else len(is_fwd)
    if any(is_fwd[k:]):
        raise WhatIfError(
            "what-if: this aot graph returns a forward output after its gradients "
            f"({descs[k + is_fwd[k:].index(True)]!r}); the partitioners need forward outputs "
            "first. Use mode='make_fx' for what_if on this model.")
    tangents = [t for _, t in outputs_and_tangents(joint) if t is not None]
    misnamed = [n.name for n in joint.placeholders
                if not n.name.startswith("tangents" if n in tangents else "primals")]
    if not tangents or misnamed:
        raise WhatIfError(
            "what-if: the aot graph lacks the primals_*/tangents_* placeholders the "
            f"partitioners expect (tangents: {[t.name for t in tangents]}, "
            f"misnamed: {misnamed[:5]}); was it edited after tracing?")
    # Fresh analysis per split graph: the partitioners copy node meta shallowly,
    # so a shared jointlab dict would let one graph's storages overwrite another's.
    drop_annotations(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args = [_empty_like_val(n.meta.get("val"), mode) for n in gm.graph.nodes
            if n.op == "placeholder"]
    return gm, k, args


def _makefx_functional_joint(joint: Any) -> tuple[fx.GraphModule, int, list[Any]]:
    src = joint.graph_module
    graph = copy.deepcopy(src.graph)
    gm = fx.GraphModule(src, graph)
    out = graph.output_node()
    outs = list(out.args[0])
    n_grads = len(joint.param_names) + len(graph_input_grads(joint.input_spec))
    loss, grads, extra = outs[0], outs[1:1 + n_grads], outs[1 + n_grads:]
    seed = next((n for n in graph.nodes if is_loss_seed(n, loss)), None)
    if seed is None:
        raise WhatIfError(
            "what-if: no ones_like(loss) node seeds the backward of this make_fx graph, so it "
            "cannot be split into forward and backward; was the graph edited after tracing?")
    seed_as_tangent(graph, seed, TANGENT)
    out.args = ([loss, *extra, *grads],)
    gm.recompile()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args = [_empty_like_val(n.meta.get("val"), mode) for n in graph.nodes if n.op == "placeholder"]
    fgm = make_fx(torch.func.functionalize(gm, remove="mutations"),
                  tracing_mode="fake")(*args)
    _drop_input_writebacks(fgm)
    phs = [n for n in fgm.graph.nodes if n.op == "placeholder"]
    tangent = phs[len(args) - 1 - _tangent_pos_from_end(graph)]
    tangent.target = TANGENT
    tag_forward(fgm, tangent)
    fgm.recompile()
    return fgm, 1 + len(extra), args


def _tangent_pos_from_end(graph: fx.Graph) -> int:
    phs = [n.target for n in graph.nodes if n.op == "placeholder"]
    return len(phs) - 1 - phs.index(TANGENT)


def _drop_input_writebacks(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if (node.op == "call_function" and op_name(node) == "copy_" and not node.users
                and node.args[0].op == "placeholder"):
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _fwd_outputs(gm: fx.GraphModule) -> list[Any]:
    return list(gm.graph.output_node().args[0])


def score(fwd: fx.GraphModule, bwd: fx.GraphModule, num_fwd_outputs: int) -> dict[str, Any]:
    """Saved bytes and peaks of one forward/backward split.

    Args:
        fwd: Forward graph (outputs: forward outputs, then saved values).
        bwd: Backward graph (placeholders: saved values, then tangents).
        num_fwd_outputs: How many leading forward outputs are not saved values.

    Returns:
        ``saved_bytes`` (activations only), ``saved_tensors``, the forward,
        backward and overall peak.
    """
    for g in (fwd, bwd):  # graphs what_if built itself: analyse them before reading
        ensure_analyzed(g)
    f, b = predict(fwd), predict(bwd)
    primals = {n.name: n for n in fwd.graph.nodes if n.op == "placeholder"}
    life = f.lifetimes.set_index("storage")
    saved = [n for n in _fwd_outputs(fwd)[num_fwd_outputs:]
             if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]
    owners = {storage_owner(n) for n in saved} - set(primals)
    saved_bytes = int(life.loc[sorted(owners), "bytes"].sum()) if owners else 0
    primal_owned = {n.name for n in saved if storage_owner(n) in primals}
    blife = b.lifetimes.set_index("storage")
    aliased = int(blife.loc[[n for n in blife.index if n in primal_owned], "bytes"].sum())
    # aot: a tied weight has one placeholder per alias; only the first owns a storage
    held = int(life.loc[[p for p in primals if p in life.index], "bytes"].sum())
    bwd_peak = b.peak_bytes - aliased + held
    return {"saved_bytes": saved_bytes, "saved_tensors": len(owners),
            "forward_peak_bytes": f.peak_bytes, "backward_peak_bytes": bwd_peak,
            "peak_bytes": max(f.peak_bytes, bwd_peak)}


def what_if(joint: Any, budgets: tuple[float, ...] = (1.0, 0.5, 0.2)) -> pd.DataFrame:
    """Score the traced joint graph, save-all and min-cut at several budgets.

    Args:
        joint: A JointGraph of either mode.
        budgets: ``activation_memory_budget`` values for min-cut rematerialisation
            (1.0 = the partitioner's default min cut).

    Returns:
        One row per option: ``option``, ``budget``, ``saved_bytes``,
        ``saved_tensors``, ``forward_peak_bytes``, ``backward_peak_bytes``,
        ``peak_bytes`` and ``error`` (why an option could not be scored).
    """
    default_partition, min_cut_rematerialization_partition, fconfig = partitioners()

    base = predict(joint)  # what joint.memory() predicts: CPU, the traced sizes
    life = base.lifetimes
    rows: list[dict[str, Any]] = [{
        "option": "joint graph as traced", "budget": None,
        "saved_bytes": base.saved_bytes,
        "saved_tensors": int((life.category == "activation").sum()),
        "forward_peak_bytes": base.forward_peak_bytes,
        "backward_peak_bytes": base.backward_peak_bytes, "peak_bytes": base.peak_bytes}]
    gm, k, args = functional_joint(joint)
    options = [("save all (default_partition)", None,
                lambda g: default_partition(g, args, num_fwd_outputs=k))]
    for b in budgets:
        options.append((f"min-cut remat, budget {b:g}", b, _mincut(
            min_cut_rematerialization_partition, fconfig, b, args, k)))
    for name, budget, split in options:
        row: dict[str, Any] = {"option": name, "budget": budget}
        try:
            fwd, bwd = split(copy.deepcopy(gm))
            row.update(score(fwd, bwd, k))
        except Exception as e:  # a partitioner limitation on this graph: report it
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    return pd.DataFrame(rows)


def _mincut(fn: Any, fconfig: Any, budget: float, args: list[Any], k: int) -> Any:
    def split(g: fx.GraphModule) -> Any:
        with fconfig.patch(activation_memory_budget=budget):
            return fn(g, args, compiler="inductor", num_fwd_outputs=k)
    return split
