"""One spelling per idea (README "Naming"); the old ones warn and still work for one release."""

from __future__ import annotations

import warnings

import pytest

import jointlab as jl
from jointlab.viz import dag
from jointlab.widgets import _explore
from tests.fixtures import zoo


@pytest.fixture(scope="module")
def unused():
    f = zoo.FIXTURES["unused_param"]
    model, inputs = f.make_model(), f.make_inputs(2)
    return model, inputs, jl.trace(model, f.train_fn, inputs)


@pytest.fixture(scope="module")
def lm():
    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def _opened(view) -> list[int]:
    return sorted(view.payload["expanded"])


def _one_deprecation(record) -> warnings.WarningMessage:
    (w,) = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert w.filename == __file__, w.filename  # points at the caller's line
    return w


def test_plot_dag_group_depth_is_a_deprecated_depth(lm):
    with pytest.warns(DeprecationWarning) as record:
        old = dag.plot_dag(lm, group_depth=2)
    msgs = [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]
    assert any("plot_dag(group_depth=...)" in m and "plot_dag(depth=...)" in m for m in msgs)
    assert all(w.filename == __file__ for w in record)  # each points at the caller's line
    with pytest.warns(DeprecationWarning) as record:
        new = dag.plot_dag(lm, depth=2)
    assert not any("group_depth" in str(w.message) for w in record)
    assert _opened(old) == _opened(new)
    with pytest.warns(DeprecationWarning):
        assert _opened(new) != _opened(dag.plot_dag(lm))  # depth did collapse


def test_plot_dag_refuses_both_spellings(lm):
    with pytest.raises(jl.errors.PlotArgumentError, match="both depth= and"), \
            pytest.warns(DeprecationWarning):
        dag.plot_dag(lm, depth=1, group_depth=2)


def test_explore_group_depth_is_a_deprecated_depth(lm):
    with pytest.warns(DeprecationWarning) as record:
        app = jl.explore(lm, group_depth=2)
    assert "explore(depth=...)" in str(_one_deprecation(record).message)
    assert app.explorer.depth.value == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jl.explore(lm, depth=3).explorer.depth.value == 3
    with pytest.raises(jl.errors.PlotArgumentError):
        _explore.explore(lm, depth=1, group_depth=2)


def test_params_and_grads_matches_eager_autograd(unused):
    model, inputs, joint = unused
    f = zoo.FIXTURES["unused_param"]
    model.zero_grad(set_to_none=True)
    f.train_fn(model, **inputs).backward()
    eager = {n: p.grad is not None for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    pairs = joint.params_and_grads()
    assert {n: g is not None for n, (_, g) in pairs.items()} == eager
    assert not all(eager.values())  # the fixture has unused parameters
    params = joint.params()
    assert all(ph is params[n] for n, (ph, _) in pairs.items())


def test_param_grads_is_a_deprecated_params_and_grads(unused):
    _, _, joint = unused
    with pytest.warns(DeprecationWarning) as record:
        old = joint.param_grads
    assert "joint.params_and_grads()" in str(_one_deprecation(record).message)
    assert old == joint.params_and_grads()


def test_node_keyed_tables_share_the_index_name(lm):
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(2)
    joint = jl.trace(model, f.train_fn, inputs)
    s = jl.Stepper(joint, model, inputs, seed=0)
    s.step(20)
    timings = s.node_timings()
    assert timings.index.name == joint.nodes.index.name == "node"
    assert set(timings.index) <= set(joint.nodes.index) and len(timings) == 20
    s.run()  # the rest runs in bulk: those nodes have no time of their own, and say so
    bulk = jl.Stepper(joint, model, inputs, seed=0)
    bulk.run()
    with pytest.raises(jl.errors.ValueNotAvailableError, match="in bulk"):
        bulk.node_timings()


def test_plot_errors_are_jointlab_errors(lm):
    with pytest.raises(jl.errors.PlotArgumentError) as info, pytest.warns(DeprecationWarning):
        dag.plot_dag(lm, color_by="rainbow")
    assert isinstance(info.value, jl.errors.JointlabError) and isinstance(info.value, ValueError)
    assert "PlotArgumentError" in jl.errors.__all__
