"""jl.record's fast path: rows derived after the step, clock marks, failures, the lazy table.

Without ``keep_bytes`` the instrumented graph only stamps the time after a view
that no in-place op can have changed, and the view's row is derived from its
argument's after the step. The reference is independent of that path: torch's
own reductions of the values a second, identically seeded record kept (every
node observed), and the exception the op raises.
"""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import NodeExecutionError
from tests.fixtures import zoo
from tests.test_record import _assert_row, _WritesThroughView
from tests.test_record_mask import _Attention, _train_fn

_STATS = ["value_shape", "value_dtype", "mean", "std", "min", "max", "norm", "nan", "inf",
          "note", "mask"]


def _both(joint, model, inputs):
    """A record on the fast path and one that kept every value, from the same seed and state."""
    torch.manual_seed(0)
    fast = jl.record(joint, copy.deepcopy(model), inputs)
    torch.manual_seed(0)
    kept = jl.record(joint, copy.deepcopy(model), inputs, keep_bytes=1 << 30)
    return fast, kept


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn"])
def test_derived_rows_match_torch_reductions_of_the_value(name):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    fast, kept = _both(joint, model, inputs)
    derived = [n for i, n in enumerate(joint.graph.nodes) if fast.observed.plan.derived[i] >= 0]
    assert len(derived) >= 10, "the fast path derived no rows: nothing checked"
    for node in derived:
        _assert_row(fast.table.loc[node.name], kept.values[node.name], node.name)
    # every statistic equal to the all-observed path's, bit for bit
    a, b = fast.table[_STATS], kept.table[_STATS]
    assert a.astype(object).equals(b.astype(object))


def test_a_view_read_after_an_inplace_write_is_observed_not_derived():
    model = _WritesThroughView()
    inputs = {"x": torch.arange(12.0).reshape(3, 4)}
    joint = jl.trace(model, lambda m, x: m(x), inputs)
    rec = jl.record(joint, model, inputs)
    plan, nodes = rec.observed.plan, list(joint.graph.nodes)
    mul_ = next(i for i, n in enumerate(nodes) if _meta.op_name(n) == "mul_")
    after = [i for i, n in enumerate(nodes) if 0 <= plan.same_as[i] < mul_ < i]
    assert after and all(plan.derived[i] < 0 for i in after)
    kept = jl.record(joint, model, inputs, keep_bytes=1 << 20)
    for i in after:
        _assert_row(rec.table.loc[nodes[i].name], kept.values[nodes[i].name], nodes[i].name)
    view_of_y = next(i for i in after if _meta.op_name(nodes[plan.same_as[i]]) == "t"
                     and _meta.op_name(nodes[plan.same_as[plan.same_as[i]]]) == "clone")
    assert rec.table.loc[nodes[view_of_y].name, "max"] == 33.0  # 3 * 11, written by mul_


def test_every_node_that_ran_has_a_time_within_the_step():
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    jl.record(joint, model, inputs)
    t0 = time.perf_counter()
    rec = jl.record(joint, model, inputs)
    wall = time.perf_counter() - t0
    times = rec.table["time_s"]
    ran = [n.name for n in joint.graph.nodes if n.op != "output"]
    assert times[ran].notna().all() and (times[ran] >= 0).all()
    assert math.isnan(times[list(joint.graph.nodes)[-1].name])  # the output node
    derived = [n.name for i, n in enumerate(joint.graph.nodes)
               if rec.observed.plan.derived[i] >= 0]
    assert derived and times[derived].notna().all()
    assert times.sum() < wall


@pytest.mark.parametrize("previous", ["derived", "observed"])
def test_a_node_failing_after_a_derived_or_observed_node_is_named(previous):
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    rec = jl.record(joint, model, inputs)
    nodes = list(joint.graph.nodes)
    derived = rec.observed.plan.derived
    victim = next(n for i, n in enumerate(nodes) if i > 1 and (derived[i - 1] >= 0) == (
        previous == "derived") and nodes[i - 1].op != "placeholder"
                  and _meta.op_name(n) in ("mm", "addmm", "bmm", "gelu", "mul", "add")
                  and derived[i] < 0)
    victim.target = torch.ops.aten.linalg_inv.default  # raises on these arguments
    victim.args = victim.args[:1]
    joint.graph_module.recompile()
    with pytest.raises(NodeExecutionError, match=rf"\b{victim.name}\b"):
        jl.record(joint, model, inputs)


def test_repr_counts_equal_the_table_with_a_mask_and_a_nan():
    torch.manual_seed(0)
    model = _Attention()
    x = torch.randn(2, 5, 8)
    x[0, 1, 2] = math.nan
    joint = jl.trace(model, _train_fn, {"x": x})
    rec = jl.record(joint, model, {"x": x})
    assert "table" not in rec.__dict__  # repr reads the observations, not the frame
    text = repr(rec)
    t = rec.table
    nonfinite = (t["nan"].fillna(0) > 0) | (t["inf"].fillna(0) > 0)
    masks = int((nonfinite & t["mask"]).sum())
    assert masks > 0 and f" {int(nonfinite.sum()) - masks} with NaN/Inf ({masks} attention" in text
    assert f"{int(t['note'].eq('').sum())} described" in text
    assert rec.table is t


class _ViewExpand(torch.nn.Module):
    """A view and an expand of a computed value, read by a reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w)  # (2, 4)
        return (h.view(8).sum() + h.unsqueeze(0).expand(3, 2, 4).sum()) * 0.5


@pytest.mark.parametrize("op", ["view", "expand"])
def test_a_view_edited_after_the_trace_is_read_from_its_value(op):
    """The trace's shape of an edited view is stale: the row follows the value the step made."""
    model, inputs = _ViewExpand(), {"x": torch.randn(2, 3)}
    joint = jl.trace(model, lambda m, x: m(x), inputs)
    rec = jl.record(joint, model, inputs)
    node = next(n for i, n in enumerate(joint.graph.nodes)
                if _meta.op_name(n) == op and rec.observed.plan.derived[i] >= 0)
    node.args = (node.args[0], [2, 2, 2] if op == "view" else [5, 2, 4])  # edited: meta not
    joint.graph_module.recompile()
    fast = jl.record(joint, model, inputs)
    kept = jl.record(joint, model, inputs, keep_bytes=1 << 20)
    value = kept.values[node.name]
    assert tuple(value.shape) == ((2, 2, 2) if op == "view" else (5, 2, 4))
    _assert_row(fast.table.loc[node.name], value, node.name)


class _RotateHalf(torch.nn.Module):
    """Rotary embedding's rotate_half, as Llama-family attention writes it (neg of a slice)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        x1, x2 = h[..., :4], h[..., 4:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return (h * 0.5 + rotated * 0.25).pow(2).mean()


def test_a_negated_value_is_derived_exactly():
    model, inputs = _RotateHalf(), {"x": torch.randn(3, 8)}
    joint = jl.trace(model, lambda m, x: m(x), inputs)
    fast, kept = _both(joint, model, inputs)
    nodes = list(joint.graph.nodes)
    negs = [nodes[i] for i in fast.observed.plan.negated]
    assert negs and all(_meta.op_name(n) == "neg" for n in negs)
    for node in negs:
        _assert_row(fast.table.loc[node.name], kept.values[node.name], node.name)
        row, seen = fast.table.loc[node.name], kept.table.loc[node.name]
        assert (row["min"], row["max"]) == (seen["min"], seen["max"])  # extremes: exact
        # sums: the argument's order of summation (a strided slice) against neg's own
        assert row["mean"] == pytest.approx(seen["mean"], rel=1e-6)
        assert row["norm"] == pytest.approx(seen["norm"], rel=1e-6)


def test_an_earlier_record_keeps_its_rows_after_a_later_step():
    """Records share one observer per graph: each keeps the lists of its own step."""
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    first = jl.record(joint, model, inputs)
    text = repr(first)
    other = {k: v * 3 if isinstance(v, torch.Tensor) and v.is_floating_point() else v
             for k, v in inputs.items()}
    second = jl.record(joint, model, other)
    assert first.loss != second.loss
    assert first.table["norm"].to_list() != second.table["norm"].to_list()
    assert repr(first) == text and first.observed.rows is not second.observed.rows
