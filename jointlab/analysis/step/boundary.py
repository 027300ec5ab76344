"""Values at a compiled stepper's stop: the buffers a kernel wrote, against graph and eager.

Which joint-graph node a buffer of the generated code holds comes from
Inductor's own record, made while it lowered the graph
(:func:`jointlab.analysis.inductor_graph.buffer_origins`): the post-grad node the
buffer is the value of. That node is mapped back to the joint graph through
Inductor's provenance (``postToPre``) and kept only when it *is* the joint
node: one joint node, same op, same shape. Anything else (a decomposed op's
partial result such as a layer norm's variance, a functional ``bernoulli``
standing for an in-place one, a buffer with no origin) is listed with the
reason and not compared: comparing it with a guessed node could call a
correct kernel wrong or a wrong one right. No stop reads as checked when
nothing was: every row that compares nothing has a note saying why.

Matched buffers are compared with the uncompiled graph (every node's value
from one run of :class:`jointlab.analysis.step.runner.NodeRunner` with the
stepper's RNG stream: its seed, or the user's state it started from) and, on
request, with eager autograd where eager recorded the
node: a probed module output or output gradient, the node itself or a chain
of views of it (views keep values; the buffer is reshaped to the probe's shape).
Tolerances are :mod:`jointlab.analysis.compare`'s dtype-aware ones. A row
beyond tolerance says so in its note (max abs and rel error); eager runs
seeded, so for a stepper without ``seed=`` a node that follows a random op is
not compared with eager, and its note says why. Before torch 2.13 Inductor's
code draws other numbers than eager even with ``fallback_random``: there a node
that follows a random op is compared with neither, and its note says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from jointlab import meta as _meta
from jointlab import torch_compat
from jointlab.analysis.compare.capture import capture_eager, probe_pairs
from jointlab.analysis.compare.judge import Tolerance, close, compute_dtype, errors
from jointlab.analysis.compare.random_ops import downstream_of, random_nodes
from jointlab.analysis.step.runner import NodeRunner
from jointlab.errors import StepperError
from jointlab.runtime.kept import model_kept

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["boundary_table", "node_of"]

#: Ops whose result holds its input's values, reshaped (boundary values follow them to eager).
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "alias", "detach"})
#: The one row of a stop whose kernel writes no buffer the generated code names.
NO_WRITES = "(no buffer)"
COLUMNS = ["buffer", "node", "shape", "graph_ok", "graph_max_abs", "eager_ok",
           "eager_max_abs", "eager_node", "note"]


def node_of(stepper: Any, buffer: str) -> tuple[str | None, str]:
    """The joint-graph node whose value ``buffer`` holds, and why (or why none).

    Args:
        stepper: A compiled stepper.
        buffer: A buffer name of the generated code (``"buf7"``).

    Returns:
        ``(node name, "")``, or ``(None, why no node is named)``.
    """
    inner = stepper.compiled.compiled
    rec = inner.buffers.get(buffer)
    source = getattr(inner, "copies", {}).get(buffer)
    if rec is None and source is not None:
        return None, (f"a layout copy of {source} that Inductor added: it holds no node of "
                      "the traced graph, so it is not compared")
    if rec is None:
        return None, ("no origin in the traced graph: Inductor recorded no node this buffer "
                      "holds, so it is not compared")
    post, target, shape = rec
    pre = (inner.provenance or {}).get("postToPre", {}).get(post, [])
    node = stepper.joint_nodes.get(pre[0]) if len(pre) == 1 else None
    if node is None:
        return None, f"post-grad node {post} comes from {len(pre)} joint nodes"
    val = node.meta.get("val")
    if str(node.target) != target or tuple(getattr(val, "shape", ())) != shape:
        return None, f"post-grad node {post} is not {node.name} itself (op or shape differ)"
    return node.name, ""


def graph_values(stepper: Any) -> dict[str, Any]:
    """Every node's value from one run of the uncompiled graph with the stepper's seed."""
    with stepper.same_stream():  # without seed=: the user's stream the stepper started from
        runner = NodeRunner(stepper.joint, stepper.model, stepper.inputs, device=stepper.device,
                            seed=stepper.seed, keep="all")
        runner.advance(len(runner.nodes))
    return {n.name: runner.lookup(n) for n in runner.nodes}


def eager_values(stepper: Any) -> dict[str, torch.Tensor]:
    """Eager values of the probed nodes (module outputs and their gradients), same seed.

    Raises:
        StepperError: The graph has no ``train_fn`` (a loaded graph).
    """
    joint = stepper.joint
    if joint.train_fn is None:
        raise StepperError("boundary(eager=True) needs the graph's train_fn, which a loaded "
                           "graph lacks; set compiled.source.train_fn first.")
    with model_kept(stepper.model) as model:  # the user's model, hooks and all, put back
        cap = capture_eager(model, joint.train_fn, stepper.inputs, list(joint.param_names),
                            seed=stepper.seed or 0)
    pairs, _ = probe_pairs(joint.graph, cap)
    return {p.node.name: p.want for p in pairs}


def after_random(stepper: Any) -> frozenset[str]:
    """Joint nodes whose value depends on a random op (the op itself included)."""
    return frozenset(n.name for n in downstream_of(random_nodes(stepper.joint.graph)))


def _unseeded_random(stepper: Any, node: str) -> bool:
    """True when eager (seeded, seed 0) cannot draw the unseeded stepper's stream for ``node``."""
    return stepper.seed is None and node in stepper.cached_values("random", after_random)


#: The note of a buffer after a random op where compiled code draws other numbers.
_DRAWS_DIFFER = (f"not compared: it follows a random op, and the code Inductor compiles on "
                 f"torch {torch.__version__} (before 2.13) draws other numbers than the graph "
                 f"and eager, even with fallback_random; step the model in eval mode, or use "
                 f"torch 2.13 or later")


def _draws_differ(stepper: Any, node: str) -> bool:
    """True when ``node`` follows a random op that this torch's compiled code draws otherwise."""
    return (not torch_compat.FALLBACK_RANDOM_DRAWS_EAGER
            and node in stepper.cached_values("random", after_random))


def probe_of(stepper: Any, name: str, probed: dict[str, Any]) -> str | None:
    """``name``, or the one chain of views of it, up to a node eager recorded (else None)."""
    node = stepper.joint_nodes[name]
    while node.name not in probed:
        views = [u for u in node.users if _meta.op_name(u) in VIEWS and u.args[0] is node]
        if len(views) != 1:
            return None
        node = views[0]
    return node.name


def _compare(row: dict[str, Any], got: torch.Tensor, side: str, want: torch.Tensor,
             tol: Tolerance) -> None:
    seen = got.reshape(want.shape) if got.numel() == want.numel() else got
    row[f"{side}_ok"] = ok = close(seen, want, tol)
    abs_err, rel_err, _ = errors(seen, want)
    row[f"{side}_max_abs"] = abs_err
    if not ok:
        what = "the uncompiled graph" if side == "graph" else "eager"
        _add_note(row, f"beyond tolerance of {what} (max abs {abs_err:.3g}, max rel "
                       f"{rel_err:.3g}; both drew the same RNG stream)")


def _unchecked(buffer: str, note: str) -> dict[str, Any]:
    """A boundary row that compares nothing yet, with why (``note``)."""
    row = dict.fromkeys(COLUMNS)
    row.update(buffer=buffer, note=note)
    return row


def _add_note(row: dict[str, Any], note: str) -> None:
    row["note"] = f"{row['note']}; {note}" if row["note"] else note


def boundary_table(stepper: Any, writes: tuple[str, ...], *, eager: bool = False,
                   rtol: float | None = None, atol: float | None = None) -> pd.DataFrame:
    """The buffers ``writes`` as held now, compared with the uncompiled graph (and eager).

    Args:
        stepper: A compiled stepper, stopped after the kernel that wrote ``writes``.
        writes: The buffer names that kernel wrote.
        eager: Also compare with eager where eager recorded the node.
        rtol: Relative tolerance (default: the graph's compute dtype's).
        atol: Absolute tolerance (default: a dtype fraction of each value's max |value|).

    Returns:
        A DataFrame indexed by buffer: ``node``, ``shape``, ``graph_ok``,
        ``graph_max_abs``, ``eager_ok``, ``eager_max_abs``, ``eager_node`` (None
        where not compared) and ``note`` (why a buffer is not compared). Every
        tensor the kernel writes has a row, and a row that compares nothing says
        why in its note (no origin in the traced graph, a layout copy); a stop
        with no such tensor gives one :data:`NO_WRITES` row saying so.
    """
    import pandas as pd

    tol = Tolerance(rtol, atol, False, compute_dtype(stepper.joint))
    ref = stepper.cached_values("graph", graph_values)
    probed = stepper.cached_values("eager", eager_values) if eager else {}
    rows = []
    for buf in writes:
        got = stepper.namespace.get(buf)
        if not isinstance(got, torch.Tensor):
            continue  # freed by the kernel's own tail (e.g. a tuple result once unpacked)
        node, note = node_of(stepper, buf)
        row = _unchecked(buf, note)
        row.update(node=node, shape=tuple(got.shape))
        if node is not None and _draws_differ(stepper, node):
            _add_note(row, _DRAWS_DIFFER)
        elif node is not None:
            want = ref.get(node)
            if isinstance(want, torch.Tensor):
                _compare(row, got, "graph", want, tol)
            else:
                row["note"] = "the uncompiled graph's value is not a tensor"
            probe = probe_of(stepper, node, probed) if probed else None
            if probe is not None and _unseeded_random(stepper, node):
                _add_note(row, "not compared with eager: it follows a random op, and eager "
                               "runs seeded while this stepper (no seed=) draws the stream it "
                               "was created with; pass seed= to compare it")
            elif probe is not None:
                _compare(row, got, "eager", probed[probe], tol)
                row["eager_node"] = probe
        rows.append(row)
    if not rows:  # never an empty table that reads as checked
        rows.append(_unchecked(NO_WRITES, "no buffer this kernel writes is named by the "
                                          "generated code and held at this stop: nothing is "
                                          "compared"))
    df = pd.DataFrame(rows, columns=COLUMNS).set_index("buffer")
    return df.astype(object).where(df.notna(), None)  # None, not NaN, where not compared
