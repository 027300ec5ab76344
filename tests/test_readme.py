"""The README as a contract: its Python blocks run, on the demo GPT and on a tiny HF GPT-2.

Each ```python block is executed as written. The "Around the graph" block builds the demo
GPT itself; for the HF run, the lines that build the model are swapped for a GPT-2 built
from a config (``use_cache=False``, as the block's comment says) and the demo GPT's module
names get HF's ``transformer.`` prefix. Blocks that need a world of processes or a mesh
plan (the fake-world sections) run with the reader's names supplied for the demo GPT; the
torchrun script is named in :data:`NOT_RUN`, so a new block is never left out silently.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

README = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)
#: First lines of blocks not run as stand-alone scripts: the two fake-world blocks name the
#: reader's own ``plan`` and ``build_and_shard`` (run below with a TP plan of the demo GPT),
#: and the torchrun script needs processes (tests/test_real_job.py runs that path).
NOT_RUN = {
    "with jl.fake_world(4, mesh={\"dp\": 2, \"tp\": 2}) as world:",
    "graphs = jl.trace_ranks(twin, train_fn, inputs)",
    "# train.py, run as: torchrun --nproc-per-node 4 train.py",
}
DEMO_BUILD = re.compile(
    r"^model = make_gpt2\(.*$\n^inputs = lm_inputs\(.*$\n^train_fn = lm_train_fn.*$", flags=re.M)
HF_BUILD = """\
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                   n_positions=16, use_cache=False, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0))
inputs = lm_inputs(batch_size=2, vocab=128, seq=16)
train_fn = lambda model, input_ids, labels: model(input_ids=input_ids, labels=labels).loss"""


def _not_run(block: str) -> bool:
    return any(block.strip().startswith(first) for first in NOT_RUN)


def _runnable() -> list[str]:
    return [b for b in BLOCKS if not _not_run(b)]


def test_every_python_block_is_run_or_named():
    for first in NOT_RUN:  # each named block still exists, once
        assert sum(b.strip().startswith(first) for b in BLOCKS) == 1, first
    assert len(_runnable()) == len(BLOCKS) - len(NOT_RUN) >= 2


def _around_the_graph() -> str:
    return next(b for b in _runnable() if "make_gpt2(" in b)


def _run(source: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)  # the blocks write report.html, step.jlg, repro.py here
    namespace: dict = {"__name__": "readme"}
    exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102 - the README's code
    return namespace


def test_using_it_block_runs_and_matches_eager(tmp_path, monkeypatch):
    block = next(b for b in _runnable() if "def train_fn" in b)
    ns = _run(block, tmp_path, monkeypatch)
    model, x, y = ns["model"], ns["x"], ns["y"]
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    for name, p in model.named_parameters():
        assert torch.equal(ns["grads"][name], p.grad), name


@pytest.mark.slow  # compiles with Inductor twice: minutes on the shared CPU (make fuzz)
@pytest.mark.parametrize("which", ["demo_gpt", "hf_gpt2"])
def test_around_the_graph_block_runs(which, tmp_path, monkeypatch):
    block = _around_the_graph()
    assert DEMO_BUILD.search(block), "the block no longer builds the demo GPT as expected"
    if which == "hf_gpt2":
        pytest.importorskip("transformers")
        block = DEMO_BUILD.sub(lambda _: "import torch\n" + HF_BUILD, block)
        block = re.sub(r'"(h\.\d)', r'"transformer.\1', block)
    ns = _run(block, tmp_path, monkeypatch)
    joint = ns["joint"]
    attn = "h.0.attn" if which == "demo_gpt" else "transformer.h.0.attn"
    assert len(joint.select(module=attn, phase="backward")) > 0
    assert (tmp_path / "report.html").stat().st_size > 0 and (tmp_path / "g.svg").exists()
    assert ns["c"].compare(ns["model"], ns["inputs"]).ok
    assert ns["big"].memory().peak_bytes > 0


def _distributed_blocks() -> str:
    """The two fake-world blocks, the second continuing inside the first's ``with``."""
    first = next(b for b in BLOCKS if b.strip().startswith("with jl.fake_world(4"))
    second = next(b for b in BLOCKS if b.strip().startswith("graphs = jl.trace_ranks("))
    assert second.startswith("    "), "the second block continues inside the first's with"
    return first + second


@pytest.mark.slow  # traces and runs a tensor-parallel world of 4 ranks
def test_fake_world_blocks_run_on_the_demo_gpt_with_the_readers_names(tmp_path, monkeypatch):
    """The blocks name what the reader brings: ``plan`` (a TP plan of their model),
    ``build_and_shard`` (a fresh sharded copy) and ``collectives``; here a TP plan of the demo
    GPT's MLPs. Everything else in the blocks runs as written."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from jointlab.analysis.distributed import collectives
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    def build():
        return make_gpt2(n_layer=2, d=64, n_head=2, vocab=128, seq=16, dropout=0.0)

    plan = {f"h.{i}.mlp.{k}": style for i in range(2)
            for k, style in ((0, ColwiseParallel()), (2, RowwiseParallel()))}
    import jointlab as jl

    names = {"jl": jl, "model": build(), "train_fn": lm_train_fn, "plan": plan,
             "inputs": lm_inputs(batch_size=2, vocab=128, seq=16),
             "parallelize_module": parallelize_module, "collectives": collectives}
    names["build_and_shard"] = lambda: parallelize_module(
        build(), names["world"].mesh["tp"], plan)
    monkeypatch.chdir(tmp_path)
    source = _distributed_blocks()
    exec(compile(source, "README.md", "exec"), names)  # noqa: S102 - the README's code
    assert names["res"].matches_eager == {0: True, 1: True, 2: True, 3: True}  # every rank
    assert len(names["graphs"].classes) >= 1 and names["joint"].runtime.rank_classes
    assert len(collectives(names["joint"])) > 0
