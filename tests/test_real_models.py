"""The real-model matrix: every family in ``tests.fixtures.real.REAL`` x both tracing modes.

Each cell traces once (``tests.util.traced_real``) and checks the graph against
independent references: eager autograd under the same seed (two steps: loss,
every gradient, every buffer), ``jl.compare``, the Stepper, the profiler's
measured peak, what-if partitions and a save/load round trip. Cells fail with
the reason (a trace error is reported as such), never skip.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import jointlab as jl
from jointlab.meta import TRAIN_FN, info
from jointlab.torch_compat import release
from tests.fixtures import real
from tests.util import eager_step, traced_real

MODES = ("make_fx", "aot")
CELLS = [(name, mode) for name in real.REAL for mode in MODES]
IDS = [f"{n}-{m}" for n, m in CELLS]
SEED = 1234
# Relative tolerance of the predicted peak against the profiler's graph-value peak
# (tests/test_memory.py holds the zoo to the same 1%).
PEAK_RTOL = 0.01
_TRACE_ERRORS: dict[tuple[str, str], str] = {}  # a failed trace is not retried per test


@pytest.fixture(params=CELLS, ids=IDS)
def cell(request):
    name, mode = request.param
    if (name, mode) not in _TRACE_ERRORS:
        try:
            return traced_real(name, mode)
        except Exception as exc:  # the trace itself is the cell's first check
            first = str(exc).splitlines()[0] if str(exc) else ""
            _TRACE_ERRORS[name, mode] = f"{type(exc).__name__}: {first}"
    pytest.fail(f"{name} does not trace in mode={mode!r}: {_TRACE_ERRORS[name, mode]}",
                pytrace=False)


def _two_steps(step, model, inputs):
    """Two steps from one seed each (dropout draws the same masks on both sides)."""
    out = []
    for k in range(2):
        torch.manual_seed(SEED + k)
        loss, grads, _ = step(model, inputs, SEED + k)
        out.append((loss, grads, {n: b.clone() for n, b in model.named_buffers()}))
    return out


# Mixtral's experts accumulate with index_put(accumulate=True), whose CPU kernel
# adds in a thread-dependent order: two eager steps already differ bitwise.
NOT_REPRODUCIBLE = {"hf_mixtral"}


def _assert_same(got, want, what, exact=True):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    if exact:
        # Both sides run the same ATen kernels on the same values in the same order
        # (the make_fx graph is eager's own dispatch, recorded): bit-exact.
        assert torch.equal(got, want), f"{what}: max abs diff {diff:.3g}"
        return
    # Reordered sums (AOT's functionalized graph sums tied-alias gradients in its
    # own order; order-dependent kernels): float32 rounding, relative to the
    # tensor's own scale.
    scale = want.abs().max().item() if want.numel() else 0.0
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * scale), (
        f"{what}: max abs diff {diff:.3g} at scale {scale:.3g}")


def _exact_vs_eager(name, mode):
    return mode == "make_fx" and name not in NOT_REPRODUCIBLE


def test_run_matches_eager_over_two_steps(cell):
    f, model, inputs, joint = cell
    g_model, e_model = copy.deepcopy(model), copy.deepcopy(model)
    graph = _two_steps(lambda m, i, s: joint.run(m, i), g_model, inputs)
    eager = _two_steps(lambda m, i, s: eager_step(m, f.train_fn, i, s), e_model, inputs)
    exact = _exact_vs_eager(f.name, joint.mode)
    for k, ((gl, gg, gb), (el, eg, eb)) in enumerate(zip(graph, eager)):
        _assert_same(gl, el, f"step {k} loss", exact)
        assert gg.keys() == eg.keys()
        for name in eg:
            _assert_same(gg[name], eg[name], f"step {k} grad {name}", exact)
        for name in eb:
            _assert_same(gb[name], eb[name], f"step {k} buffer {name}", exact)


@functools.cache
def _compared(name, mode):
    """``jl.compare`` of a traced cell, run once: both tests below read the same result."""
    _, model, inputs, joint = traced_real(name, mode)
    return jl.compare(joint, model, inputs, seed=SEED)


def test_compare_is_clean(cell):
    f, model, inputs, joint = cell
    cmp = _compared(f.name, joint.mode)
    bad = [t[~t["ok"]] for t in (cmp.loss, cmp.grads, cmp.loss_dict, cmp.buffers) if len(t)]
    assert cmp.ok and cmp.first_divergence is None, (
        f"first divergence: {cmp.first_divergence}; failing rows: "
        f"{[b.index.tolist()[:5] for b in bad if len(b)]}")


def test_stepper_to_the_end_equals_run(cell):
    f, model, inputs, joint = cell
    s = jl.Stepper(joint, model, inputs, seed=SEED, device="cpu")
    s_loss, s_grads, _ = s.run()
    m = copy.deepcopy(model)
    torch.manual_seed(SEED)
    loss, grads, _ = joint.run(m, inputs)
    exact = f.name not in NOT_REPRODUCIBLE  # the same graph on both sides
    _assert_same(s_loss, loss, "loss", exact)
    for name in grads:
        _assert_same(s_grads[name], grads[name], f"grad {name}", exact)
    for name, b in m.named_buffers():
        _assert_same(s.buffers()[name], b, f"buffer {name}", exact)


def test_memory_predicted_equals_measured(cell):
    f, model, inputs, joint = cell
    prof = joint.memory(copy.deepcopy(model), inputs)
    assert prof.measured
    assert abs(prof.peak_error) <= PEAK_RTOL, (
        f"predicted {prof.peak_bytes} vs measured {prof.measured_peak_bytes} "
        f"({100 * prof.peak_error:+.2f}%)")


def test_what_if_scores_every_option(cell):
    f, model, inputs, joint = cell
    if ("checkpoint" in f.name and joint.mode == "make_fx"
            and release(torch.__version__) < (2, 13, 0)):
        pytest.skip("what-if's recompute options need torch 2.13 or newer for a checkpointed "
                    "graph (2.11's partitioner rejects its generator-state ops; the rows "
                    f"say so in 'error'); this is torch {torch.__version__}")
    df = joint.memory().what_if(budgets=(0.5,))
    errors = df["error"].dropna().tolist() if "error" in df else []
    assert not errors, errors
    rows = df.set_index("option")
    assert rows.loc["joint graph as traced", "peak_bytes"] == joint.memory().peak_bytes
    assert (df["saved_bytes"] >= 0).all() and (df["peak_bytes"] > 0).all()


def test_save_load_keeps_compare_and_run(cell, tmp_path):
    f, model, inputs, joint = cell
    path = tmp_path / "g.jlg"
    joint.save(str(path))
    loaded = jl.load(str(path))
    outs = []
    for j in (joint, loaded):
        m = copy.deepcopy(model)
        torch.manual_seed(SEED)
        outs.append((*j.run(m, inputs)[:2], dict(m.named_buffers())))
    (l0, g0, b0), (l1, g1, b1) = outs
    exact = f.name not in NOT_REPRODUCIBLE  # the same graph, saved and loaded
    _assert_same(l1, l0, "loss", exact)
    for name in g0:
        _assert_same(g1[name], g0[name], f"grad {name}", exact)
    for name in b0:
        _assert_same(b1[name], b0[name], f"buffer {name}", exact)
    c0 = _compared(f.name, joint.mode)
    c1 = jl.compare(loaded, model, inputs, seed=SEED, train_fn=f.train_fn)
    assert c1.ok == c0.ok
    if exact:
        assert c1.verdict == c0.verdict
        assert str(c1.first_divergence) == str(c0.first_divergence)
        assert c1.grads["max_abs_err"].tolist() == c0.grads["max_abs_err"].tolist()


# -- gradient-accumulation attribution (HF GPT-2 with a computed loss_dict value) ---------
def _gpt2_with_ppl(model, input_ids, labels):
    out = model(input_ids=input_ids, labels=labels, use_cache=False)
    return out.loss, {"ppl": out.loss.exp()}


@pytest.fixture(scope="module", params=MODES)
def gpt2_ppl(request):
    f = real.get("hf_gpt2")
    model, inputs = f.make_model(), f.make_inputs()
    return model, jl.trace(model, _gpt2_with_ppl, inputs, mode=request.param)


def _is_seed(node, joint):
    loss = joint.outputs_and_tangents()[0][0]
    return node.op == "placeholder" or "ones_like" in str(node.target) and node.args[0] is loss


def test_only_train_fn_ops_are_attributed_to_train_fn(gpt2_ppl):
    model, joint = gpt2_ppl
    by_name = {n.name: n for n in joint.graph.nodes}
    # Only ops the loss depends on are differentiated: the loss's forward ancestors.
    on_loss_path, todo = set(), [joint.outputs_and_tangents()[0][0]]
    while todo:
        n = todo.pop()
        if n not in on_loss_path:
            on_loss_path.add(n)
            todo.extend(n.all_input_nodes)
    wrong = []
    for n in joint.graph.nodes:
        meta = info(n)
        if meta.get("phase") != "backward" or meta.get("module") != TRAIN_FN or _is_seed(n, joint):
            continue
        twin = by_name.get(meta.get("fwd_twin", ""))
        reads_train_fn = all(info(a).get("module") == TRAIN_FN for a in n.all_input_nodes)
        differentiates = (twin is not None and twin in on_loss_path
                          and info(twin)["module"] == TRAIN_FN)
        if not (differentiates or (reads_train_fn and not n.meta.get("is_gradient_acc"))):
            wrong.append((n.name, str(n.target), meta.get("source")))
    assert not wrong, f"backward nodes wrongly attributed to {TRAIN_FN}: {wrong}"


def test_gradient_accumulation_adds_belong_where_their_value_is_used(gpt2_ppl):
    model, joint = gpt2_ppl
    accs = [n for n in joint.graph.nodes if n.meta.get("is_gradient_acc")]
    assert accs
    # Reference from the model itself: which module owns the tied wte weight.
    wte_owner = next(name for name, mod in model.named_modules()
                     if any(p is model.transformer.wte.weight for p in mod.parameters(False)))
    grad_wte = joint.params_and_grads()["transformer.wte.weight"][1]
    tied = [a for a in accs if grad_wte in a.users or a is grad_wte]
    # make_fx sums the tied weight's two gradient terms in the graph; AOT returns one
    # gradient per alias and the runtime sums them, so its graph has no such add.
    assert bool(tied) == (joint.mode == "make_fx")
    assert all(info(a)["module"] == wte_owner for a in tied)
    for a in accs:
        # Reference from the graph: each summed term's forward twin reads the value
        # (or a residual add does); all those readers sit inside the acc's module.
        mod = info(a)["module"]
        assert mod != TRAIN_FN and mod, (a.name, mod)
        assert info(a)["source"] != "" or a in tied, a.name
        if a in tied:
            continue
        value = next(n for n in joint.graph.nodes if n.name == info(a)["grad_acc_of"])
        assert a.meta["val"].shape == value.meta["val"].shape
        readers = [info(u)["module"] for u in value.users if info(u).get("phase") == "forward"]
        assert readers and all(r == mod or r.startswith(mod + ".") for r in readers), (
            a.name, mod, readers)
