"""Issue 41 items 4-5: a compiled dropout that draws another mask; shared submodules' FQNs.

Item 4: float64 eager draws its own masks, so it never excuses a value downstream
of a random op, and a compiled divergence there names the random op. The
candidate that draws another mask is injected (one extra draw before the compiled
call: Inductor with fallback_random draws eager's own mask on CPU otherwise).
Item 5: a sub-model held outside the root (a closure) while another shares its
embedding made torch name modules relative to it; the module column must hold
FQNs of the traced model, checked against its own ``named_modules``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.meta import KEY, TRAIN_FN


class _Net(nn.Module):
    """conv (channels-last input) -> dropout -> linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.drop = nn.Dropout(0.3)
        self.classifier = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(F.relu(self.conv(x)).mean((2, 3))))


def _ce(m, x, y):
    return F.cross_entropy(m(x), y)


@pytest.fixture(scope="module")
def dropout_compiled():
    torch.manual_seed(0)
    model = _Net().train()
    inputs = {"x": torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last),
              "y": torch.randint(0, 4, (4,))}
    joint = jl.trace(model, _ce, inputs)
    return model, inputs, joint, joint.compile()


def _other_draw(compiled):
    inner = compiled.compiled

    def call(*args):
        torch.rand(7)  # the compiled dropout now draws another mask than eager's
        return inner(*args)
    return call


def _compare_with_another_draw(c, model, inputs):
    """``c.compare`` with its compiled code drawing another dropout mask, then put back."""
    saved = c.compiled
    c.compiled = _other_draw(c)
    try:
        return c.compare(model, inputs, train_fn=_ce)
    finally:
        c.compiled = saved


def test_clean_compile_with_dropout_is_no_mismatch(dropout_compiled):
    model, inputs, _, c = dropout_compiled
    r = c.compare(model, inputs, train_fn=_ce)
    assert r.ok and r.first_divergence is None


def test_another_mask_is_not_excused_by_float64_and_names_the_dropout(dropout_compiled):
    model, inputs, joint, c = dropout_compiled
    r = _compare_with_another_draw(c, model, inputs)
    assert r.verdict == "MISMATCH"
    # the loss differs from eager's: float32 eager is the reference, float64 never excuses it
    loss = r.loss[r.loss["candidate"] != "graph"]
    assert not loss["ok"].astype(bool).any()
    assert not any("eager's own rounding" in n for n in r.notes)
    random_note = [n for n in r.notes if "float64 reference means nothing" in n]
    assert len(random_note) == 1 and "in 'drop'" in random_note[0] and "loss" in random_note[0]
    # first_divergence: the graph's random op, in the dropout module, not the classifier
    drop = [n for n in joint.graph.nodes if n.meta.get(KEY, {}).get("module") == "drop"
            and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]
    first = r.first_divergence
    assert first is not None and first.node == drop[0].name and first.module == "drop"
    assert first.candidate != "graph" and "random op" in first.what
    assert any("downstream of random op" in n for n in r.notes)


def test_float64_never_accepts_a_value_downstream_of_the_dropout(dropout_compiled):
    """Where float64 eager drew masks that put it as near the candidate as eager (SegFormer)."""
    import dataclasses

    from jointlab.analysis.compare.capture import capture_eager
    from jointlab.analysis.compare.fp64 import accept_by_fp64
    from jointlab.analysis.compare.judge import Tolerance
    from jointlab.analysis.compare.random_ops import referee_fp64

    model, inputs, joint, c = dropout_compiled
    r = _compare_with_another_draw(c, model, inputs)
    eager = capture_eager(model, _ce, inputs, joint.param_names, seed=0)
    fp64 = r.fp64.copy()
    fp64["candidate_vs_fp64"] = 0.0  # the candidate sits on float64's own (other) draw
    comp = dataclasses.replace(r, fp64=fp64, notes=())
    tol = Tolerance(None, None, False, torch.float32)
    assert any("eager's own rounding" in n for n in accept_by_fp64(comp, eager, tol).notes)
    judged = referee_fp64(comp, eager, tol, joint)
    assert judged.verdict == "MISMATCH"
    assert not any("eager's own rounding" in n for n in judged.notes)
    assert not judged.loss[judged.loss["candidate"] != "graph"]["ok"].astype(bool).any()


# -- item 5: shared submodules ------------------------------------------------------
class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.mlp(self.attn(x)))


class _Encoder(nn.Module):
    def __init__(self, emb: nn.Embedding) -> None:
        super().__init__()
        self.embeddings = emb
        self.encoder = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(ids)
        for block in self.encoder:
            h = block(h)
        return self.head(h)


class _Pair(nn.Module):
    """A generator and a discriminator sharing one embedding (ELECTRA's set-up)."""

    def __init__(self) -> None:
        super().__init__()
        emb = nn.Embedding(50, 16)
        self.gen, self.disc = _Encoder(emb), _Encoder(emb)


def _check_fqns(model, joint):
    names = dict(model.named_modules(remove_duplicate=False))
    nodes = [n for n in joint.graph.nodes
             if n.meta.get(KEY, {}).get("phase") in ("forward", "backward")]
    wrong = [(n.name, n.meta[KEY]["module"]) for n in nodes
             if n.meta[KEY]["module"] not in names and n.meta[KEY]["module"] != TRAIN_FN]
    assert not wrong, wrong[:5]
    fwd = {n.meta[KEY]["module"] for n in nodes if n.meta[KEY]["phase"] == "forward"}
    for sub in ("gen", "disc"):
        for block in ("encoder.0.attn", "encoder.1.mlp.2", "head", "embeddings"):
            assert f"{sub}.{block}" in fwd, (sub, block)
    return nodes


@pytest.mark.parametrize("how", ["closure", "root"])
def test_shared_submodule_keeps_fqns_of_the_traced_model(how):
    torch.manual_seed(0)
    model = _Pair()
    gen, disc = model.gen, model.disc

    def step(m, ids):
        if how == "closure":  # the sub-models held outside the root: torch names them relative
            return gen(ids).mean() + disc(ids).mean()
        return m.gen(ids).mean() + m.disc(ids).mean()
    inputs = {"ids": torch.randint(0, 50, (2, 5))}
    joint = jl.trace(model, step, inputs)
    _check_fqns(model, joint)
    table = joint.nodes  # the node table reads the same column
    names = dict(model.named_modules(remove_duplicate=False))
    assert set(table["module"]) <= set(names) | {TRAIN_FN, ""}
    r = jl.compare(joint, model, inputs, train_fn=step)
    assert r.ok


def test_shared_embedding_in_hf_electra_pair():
    tr = pytest.importorskip("transformers")
    cfg = tr.ElectraConfig(vocab_size=64, embedding_size=16, hidden_size=16,
                           num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=16, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = nn.Module()
    model.gen = tr.ElectraForMaskedLM(cfg)
    model.disc = tr.ElectraForPreTraining(cfg)
    model.disc.electra.embeddings = model.gen.electra.embeddings
    model.train()
    gen, disc = model.gen, model.disc

    def step(m, ids, labels):
        return (gen(input_ids=ids, labels=labels).loss
                + disc(input_ids=ids, labels=ids % 2).loss)
    inputs = {"ids": torch.randint(0, 64, (2, 6)), "labels": torch.randint(0, 64, (2, 6))}
    joint = jl.trace(model, step, inputs)
    names = dict(model.named_modules(remove_duplicate=False))
    mods = {n.meta[KEY]["module"] for n in joint.graph.nodes if KEY in n.meta}
    assert mods <= set(names) | {TRAIN_FN, ""}, sorted(mods - set(names))[:5]
    for sub in ("gen", "disc"):
        assert f"{sub}.electra.encoder.layer.0.attention.self.query" in mods
