"""``compare``: run the joint graph and eager autograd from the same start, side by side.

Each side gets its own deep copy of the model and the same RNG seed, so
dropout draws the same masks and neither side changes the user's model. The
result, a :class:`Comparison`, holds the loss, per-parameter gradient errors
against dtype-aware tolerances, the loss_dict, the buffers after the step,
and ``first_divergence``: the first graph node, in graph order, whose value
differs from the eager value at the same point (see :mod:`jointlab._capture`).
A compiled joint (``joint.compile()``) is compared as well as the graph it
came from, so "inductor vs graph vs eager" is one call.
"""

from __future__ import annotations

import copy
import html
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import nn

from . import _meta
from ._capture import EagerCapture, capture_eager, grad_node, match_calls, to_device
from ._refusals import torch_errors

if TYPE_CHECKING:
    import pandas as pd

    from ._graph import JointGraph

__all__ = ["Comparison", "Divergence", "compare", "default_tolerances"]

_TOLERANCES = {  # dtype -> (rtol, atol)
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """Return ``(rtol, atol)`` for comparing values of ``dtype``."""
    return _TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Divergence:
    """The first graph node whose value differs from eager."""

    node: str
    module: str
    source: str
    phase: str
    what: str  # "module output", "output gradient", "parameter gradient", "loss"
    max_abs_err: float

    def __str__(self) -> str:
        """One line naming node, module and source."""
        return (f"{self.node} ({self.what} of module '{self.module}', {self.phase}, "
                f"{self.source or 'no source'}): max abs err {self.max_abs_err:.3g}")


# -- numeric comparison ----------------------------------------------------------
def errors(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """Return ``(max abs err, max rel err, cosine similarity)`` of ``a`` against ``b``."""
    if a.shape != b.shape:
        return float("inf"), float("inf"), float("nan")
    x, y = a.detach().double().flatten().cpu(), b.detach().double().flatten().cpu()
    if x.numel() == 0:
        return 0.0, 0.0, 1.0
    diff = (x - y).abs()
    abs_err = float(diff.max())
    rel_err = float((diff / y.abs().clamp_min(1e-12)).max())
    denom = float(x.norm() * y.norm())
    cos = float(x @ y) / denom if denom > 0 else (1.0 if abs_err == 0 else 0.0)
    return abs_err, rel_err, cos


def close(a: Any, b: Any, rtol: float | None, atol: float | None) -> bool:
    """True when ``a`` matches eager value ``b`` within (dtype-default) tolerances."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    r, t = default_tolerances(b.dtype)
    return bool(torch.isclose(a.to(b.device), b, rtol=r if rtol is None else rtol,
                              atol=t if atol is None else atol, equal_nan=True).all())


def _rows(pairs: dict[str, tuple[Any, Any]], rtol, atol, candidate: str) -> list[dict]:
    rows = []
    for name, (got, want) in pairs.items():
        if want is None:  # eager has no gradient: graph must emit zeros
            want = torch.zeros_like(got)
        abs_err, rel_err, cos = errors(got, want)
        rows.append({"candidate": candidate, "name": name, "shape": tuple(got.shape),
                     "dtype": str(got.dtype).removeprefix("torch."), "max_abs_err": abs_err,
                     "max_rel_err": rel_err, "cosine": cos,
                     "ok": close(got, want, rtol, atol)})
    return rows


# -- running the candidates ------------------------------------------------------
def _candidates(joint: Any) -> dict[str, Any]:
    from ._compile import CompiledJoint

    items = joint if isinstance(joint, (list, tuple)) else [joint]
    out: dict[str, Any] = {}
    for j in items:
        if isinstance(j, CompiledJoint):
            out[j.backend] = j
            out.setdefault("graph", j.joint)
        else:
            out["graph" if "graph" not in out else f"graph{len(out)}"] = j
    return out


def _run_graph(joint: JointGraph, model: nn.Module, inputs: dict[str, Any], seed: int,
               device: torch.device, keep: set[str]):
    from ._step import Stepper

    s = Stepper(joint, copy.deepcopy(model), inputs, device=device, seed=seed, keep=keep)
    out = s.run()
    return out, s.buffers(), s


def _run_compiled(compiled: Any, model: nn.Module, inputs: dict[str, Any], seed: int,
                  device: torch.device):
    m = copy.deepcopy(model).to(device)
    inp = to_device(inputs, device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = compiled.run(m, inp)
    return out, dict(m.named_buffers())


@torch_errors("jl.compare")
def compare(joint: Any, model: nn.Module, inputs: dict[str, Any], *, seed: int = 0,
            rtol: float | None = None, atol: float | None = None,
            device: str | torch.device | None = None, train_fn: Any = None) -> Comparison:
    """Run the joint graph and eager autograd from the same state and seed, and compare.

    Args:
        joint: A JointGraph, a compiled one (``joint.compile()``), or a list of them.
        model: The user's model (never changed: each side runs on a deep copy).
        inputs: Keyword inputs for ``train_fn``.
        seed: RNG seed used by both sides (dropout matches exactly).
        rtol: Relative tolerance; default depends on the dtype.
        atol: Absolute tolerance; default depends on the dtype.
        device: Run both sides here; default: where the model lives.
        train_fn: The training step; default ``joint.train_fn``.

    Returns:
        A :class:`Comparison`.
    """
    cands = _candidates(joint)
    graph = cands["graph"]
    train_fn = train_fn or getattr(graph, "train_fn", None)
    if train_fn is None:
        raise TypeError("compare needs the training step: pass train_fn=..., or use a "
                        "JointGraph that records it (joint.train_fn)")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    eager_model = copy.deepcopy(model).to(dev)
    eager = capture_eager(eager_model, train_fn, to_device(inputs, dev), graph.param_names,
                          seed=seed)
    del eager_model
    pairs = match_calls(graph.graph, eager.calls)
    grad_pairs = [(g, c, i) for n, c, i in pairs if i in c.grads
                  for g in [grad_node(n, c.fqn)] if g is not None]
    keep = {n.name for n, _, _ in pairs + grad_pairs}
    results: dict[str, tuple] = {}
    stepper = None
    for name, cand in cands.items():
        if cand is graph:
            out, bufs, stepper = _run_graph(graph, model, inputs, seed, dev, keep)
        else:
            out, bufs = _run_compiled(cand, model, inputs, seed, dev)
        results[name] = (out, bufs)
    first = first_divergence(graph, stepper, eager, pairs, grad_pairs, rtol, atol)
    return Comparison.build(results, eager, first, rtol, atol)


def first_divergence(joint: JointGraph, stepper: Any, eager: EagerCapture, pairs: list,
                     grad_pairs: list, rtol, atol) -> Divergence | None:
    """Find the first graph node, in graph order, whose value differs from eager."""
    checks: list[tuple[fx.Node, torch.Tensor, str]] = []
    checks += [(n, c.outputs[i], "module output") for n, c, i in pairs]
    checks += [(g, c.grads[i], "output gradient") for g, c, i in grad_pairs]
    # A parameter's gradient node holds its full gradient only when it is the
    # sole one; tied aliases in AOT mode each carry a partial gradient.
    grad_count = Counter(_meta.info(n).get("grad_of") for n in joint.graph.nodes)
    for name, (_ph, gnode) in joint.param_grads.items():
        want = eager.grads.get(name)
        if gnode is not None and want is not None and grad_count[name] == 1:
            checks.append((gnode, want, "parameter gradient"))
    loss_node = joint.outputs_and_tangents()[0][0]  # the loss, in either mode's layout
    if isinstance(loss_node, fx.Node):
        checks.append((loss_node, eager.loss, "loss"))
    order = {n: i for i, n in enumerate(joint.graph.nodes)}
    checks.sort(key=lambda x: order[x[0]])
    outputs = stepper.outputs
    for node, want, what in checks:
        got = _graph_value(stepper, node, outputs, joint)
        if isinstance(got, torch.Tensor) and got.shape != want.shape \
                and got.numel() == want.numel():
            want = want.reshape(got.shape)
        if got is None or close(got, want, rtol, atol):
            continue
        info = _meta.info(node)
        return Divergence(node.name, info.get("module", ""), info.get("source", ""),
                          info.get("phase", ""), what, errors(got, want)[0])
    return None


def _graph_value(stepper: Any, node: fx.Node, outputs: Any, joint: JointGraph) -> Any:
    if node in stepper.env:
        return stepper.env[node]
    outs = list(joint.graph.output_node().args[0])
    if node in outs and stepper._outputs is not None:
        return stepper._outputs[outs.index(node)]
    return None


# -- the result -------------------------------------------------------------------
@dataclass
class Comparison:
    """Graph (and compiled) results against eager autograd for one training step.

    Attributes:
        ok: Every loss, gradient, loss_dict value and buffer is within tolerance.
        loss: DataFrame: one row per candidate, the loss beside eager's.
        grads: DataFrame: one row per candidate and parameter with ``max_abs_err``,
            ``max_rel_err``, ``cosine`` and ``ok``.
        loss_dict: DataFrame like ``grads`` for the loss_dict values.
        buffers: DataFrame like ``grads`` for the buffers after the step.
        first_divergence: The first diverging graph node, or None.
    """

    ok: bool
    loss: pd.DataFrame
    grads: pd.DataFrame
    loss_dict: pd.DataFrame
    buffers: pd.DataFrame
    first_divergence: Divergence | None

    @classmethod
    def build(cls, results: dict[str, tuple], eager: EagerCapture,
              first: Divergence | None, rtol, atol) -> Comparison:
        """Assemble the tables from each candidate's ``(outputs, buffers)``."""
        loss_rows, grad_rows, ld_rows, buf_rows = [], [], [], []
        for name, ((loss, grads, ld), bufs) in results.items():
            loss_rows += _rows({"loss": (loss, eager.loss)}, rtol, atol, name)
            loss_rows[-1].update(value=float(loss), eager=float(eager.loss))
            grad_rows += _rows({k: (g, eager.grads[k]) for k, g in grads.items()},
                               rtol, atol, name)
            ld_rows += _rows({k: (v, eager.loss_dict[k]) for k, v in ld.items()
                              if isinstance(v, torch.Tensor)}, rtol, atol, name)
            buf_rows += _rows({k: (v, eager.buffers[k]) for k, v in bufs.items()
                               if k in eager.buffers}, rtol, atol, name)
        tables = [_frame(r) for r in (loss_rows, grad_rows, ld_rows, buf_rows)]
        ok = all(bool(t["ok"].all()) for t in tables if len(t)) and first is None
        return cls(ok, *tables, first)

    def _repr_html_(self) -> str:
        head = "match" if self.ok else "MISMATCH"
        color = "#1a7f37" if self.ok else "#cf222e"
        parts = [f"<div class='jl-compare'><b style='color:{color}'>jointlab compare: {head}</b>"]
        if self.first_divergence is not None:
            parts.append(f"<p>first divergence: <code>{html.escape(str(self.first_divergence))}"
                         "</code></p>")
        for title, df in (("loss", self.loss), ("gradients", self.grads),
                          ("loss_dict", self.loss_dict), ("buffers", self.buffers)):
            if len(df):
                parts.append(f"<h4>{title}</h4>{table_html(df)}")
        return "".join(parts) + "</div>"


def _frame(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd

    cols = ["candidate", "name", "shape", "dtype", "max_abs_err", "max_rel_err", "cosine", "ok"]
    df = pd.DataFrame(rows)
    return df if len(df) else pd.DataFrame(columns=cols)


def table_html(df: pd.DataFrame) -> str:
    """An HTML table of ``df`` with failing rows (``ok`` False) highlighted."""
    cols = list(df.columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for _, r in df.iterrows():
        style = "" if r.get("ok", True) else " style='background:#ffebe9' class='jl-fail'"
        cells = "".join(f"<td>{html.escape(_fmt(r[c]))}</td>" for c in cols)
        body.append(f"<tr{style}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
