"""``jl.Stepper(compiled)`` on HF models whose trace bakes tensor constants (issue 41, item 6).

HF's KV cache (``use_cache=True``, GPT-2's default; Falcon's) leaves empty
``_tensor_constant*`` tensors in the traced graph. Inductor lifts them to leading
inputs of its generated ``call``; the compiled stepper, which runs ``call`` piece by
piece, must pass them as the compiled module does (before: ``not enough values to
unpack (expected 33, got 29)``). GPT-2 keeps its dropout, so it also checks that the
stepper draws what ``compiled.run`` draws: both are run after the same
``torch.manual_seed``, the stepper with and without ``seed=``. Two compiles in all
(tiny random-init models), shared by every test.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import jointlab as jl
from jointlab.analysis.compare.judge import Tolerance
from jointlab.analysis.step.boundary import after_random
from jointlab.analysis.step.compiled_checks import check_arity
from jointlab.analysis.step.kernel_code import call_arity
from jointlab.errors import CompiledGraphError
from tests.fixtures.view_models import tiny_falcon
from tests.util import assert_same_bits, one_thread

transformers = pytest.importorskip("transformers")

SEED = 3


def _lm_loss(m, ids):
    return m(input_ids=ids, labels=ids).loss


def _compiled(model):
    """Trace and compile ``model`` (tiny) and one ``compiled.run`` under ``SEED``."""
    torch.manual_seed(1)
    inputs = {"ids": torch.randint(0, 64, (2, 8))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = jl.trace(model, _lm_loss, inputs)
    c = joint.compile()
    torch.manual_seed(SEED)
    want = c.run(model, inputs)
    return model, inputs, c, want


@pytest.fixture(scope="module")
def gpt2():
    """HF GPT-2, use_cache left at its default (True), dropout 0.1 (train mode)."""
    with one_thread():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16)
        assert cfg.use_cache and cfg.resid_pdrop > 0
        yield _compiled(transformers.GPT2LMHeadModel(cfg).train())


@pytest.fixture(scope="module")
def falcon():
    """HF Falcon (KV cache constants), no dropout: the kernel probe can run on it too."""
    with one_thread():
        yield _compiled(tiny_falcon())


def _extra_args(c, model, inputs):
    """How many more args the generated ``call`` takes than the graph gives."""
    n_graph = len(c.source.runtime.prepare(c.source, c.source.flat_args(model, inputs)))
    return call_arity(c.compiled.source_code) - n_graph


@pytest.mark.parametrize("which", ["gpt2", "falcon"])
def test_stepper_runs_where_compiled_run_runs(which, request):
    model, inputs, c, want = request.getfixturevalue(which)
    consts = [n.target for n in c.source.graph.nodes if n.op == "get_attr"]
    assert consts and _extra_args(c, model, inputs) == len(consts)  # taken before the args
    with one_thread():
        torch.manual_seed(SEED)
        got = jl.Stepper(c, model, inputs).run()  # as the README shows it: no seed=
        assert_same_bits(got.loss, want.loss, "loss")
        assert_same_bits(got.grads, want.grads, "grads")
        got = jl.Stepper(c, model, inputs, seed=SEED).run()
        assert_same_bits(got.loss, want.loss, "loss (seed=)")
        assert_same_bits(got.grads, want.grads, "grads (seed=)")


def test_unseeded_stepper_draws_what_compiled_run_draws(gpt2):
    model, inputs, c, want = gpt2
    with one_thread():
        torch.manual_seed(SEED)
        before = torch.get_rng_state()
        s = jl.Stepper(c, model, inputs)
        assert torch.equal(torch.get_rng_state(), before)  # creating draws nothing
        s.step(3)
        assert torch.equal(torch.get_rng_state(), before)  # nor does stepping: its own copy
        torch.manual_seed(SEED + 1)  # the user's stream moves on: the stepper's does not
        assert_same_bits(s.run().loss, want.loss, "loss")
        s.reset()
        assert_same_bits(s.run().grads, want.grads, "grads after reset")
        torch.manual_seed(SEED + 1)
        other = c.run(model, inputs)
        assert not torch.equal(other.loss, want.loss)  # the masks matter to the loss
        torch.manual_seed(SEED + 1)
        assert_same_bits(jl.Stepper(c, model, inputs).run().loss, other.loss, "loss, seed 4")


def _boundary_rows(s):
    rows = []
    while not s.done:
        s.step()
        tab = s.boundary(eager=True)
        rows += [dict(row, kernel=s.last, buffer=b) for b, row in tab.iterrows()]
    return rows


@pytest.mark.parametrize("seed", [None, SEED])
def test_no_boundary_row_reads_false_without_a_note(gpt2, seed):
    model, inputs, c, _ = gpt2
    with one_thread():
        torch.manual_seed(SEED)
        s = jl.Stepper(c, model, inputs, seed=seed)
        torch.rand(5)  # the user's stream moves on: the references follow the stepper's
        rows = _boundary_rows(s)
    silent = [r for r in rows if False in (r["graph_ok"], r["eager_ok"]) and not r["note"]]
    assert silent == []
    graph_ok = [r for r in rows if r["graph_ok"] is not None]
    assert graph_ok and all(r["graph_ok"] for r in graph_ok)  # one stream on both sides
    after = {r["node"] for r in graph_ok if r["node"] in after_random(s)}
    assert after  # buffers downstream of dropout were compared with the graph, and matched
    eager = [r for r in rows if r["eager_ok"] is not None]
    assert all(r["eager_ok"] for r in eager)
    skipped = [r for r in rows if "not compared with eager" in (r["note"] or "")]
    if seed is None:  # eager runs seeded: the dropout-dependent rows say why they are skipped
        assert skipped and all(r["eager_ok"] is None for r in skipped)
    else:  # seeded: eager draws the same masks, every probed row is compared
        assert eager and not skipped


def test_a_wrong_buffer_reads_false_with_a_note(gpt2):
    model, inputs, c, _ = gpt2
    with one_thread():
        torch.manual_seed(SEED)
        s = jl.Stepper(c, model, inputs)
        while not s.done:
            s.step()
            tab = s.boundary()
            named = [b for b, row in tab.iterrows() if row["graph_ok"]]
            if named:
                break
        s.namespace[named[0]].add_(1.0)  # what a miscompiled kernel would have written
        row = s.boundary().loc[named[0]]
    assert not row["graph_ok"]
    assert "beyond tolerance of the uncompiled graph" in row["note"]


def test_kernel_probe_passes_the_lifted_constants(falcon):
    model, inputs, c, _ = falcon
    with one_thread():
        check = c.first_diverging_kernel(model, inputs, Tolerance(floor=torch.float32))
    assert check.first is None and check.checked > 0


def test_a_call_taking_other_args_is_refused_in_words(falcon):
    model, inputs, c, _ = falcon
    n_graph = len(c.source.runtime.prepare(c.source, c.source.flat_args(model, inputs)))
    check_arity(c.compiled, n_graph)  # what the stepper gives is what call() takes
    blind = SimpleNamespace(source_code=c.compiled.source_code, lifted=[])
    with pytest.raises(CompiledGraphError, match=r"call\(\) takes \d+ args.*lifted 0"):
        check_arity(blind, n_graph)
