"""The per-step measurement against independent references."""

from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import jointlab as jl
from jointlab.analysis.memory.measure import (
    StepInterpreter,
    _walk,
    carry_forward,
    live_at_start,
    measure_graph,
)
from jointlab.errors import NodeExecutionError
from tests.fixtures import zoo


class StorageTracker(TorchDispatchMode):
    """Second, independent measure: storages of op outputs, tracked by weakref."""

    def __init__(self, known):
        super().__init__()
        # storages live before the run are counted separately: track them at 0 bytes
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {
            t.untyped_storage().data_ptr(): (StorageWeakRef(t.untyped_storage()), 0)
            for t in known}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                old = self.refs.get(s.data_ptr())
                if old is None or old[0].expired():
                    self.refs[s.data_ptr()] = (StorageWeakRef(s), s.nbytes())
        return out

    def live(self) -> int:
        return sum(n for r, n in self.refs.values() if not r.expired())


class TrackerSampler:
    """Samples the tracker right after each op returns (graph values only)."""

    def __init__(self, tracker):
        self.tracker, self.samples = tracker, {}

    def start_step(self, step):
        pass

    def op_returned(self, step):
        self.samples[step] = self.tracker.live()


def _setup(name):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    return joint, joint.flat_args(model, inputs)


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "tiny_lm", "shared_submodule"])
def test_profiler_graph_values_equal_weakref_tracker(name):
    joint, args = _setup(name)
    gm = joint.graph_module
    torch.manual_seed(0)
    meas = measure_graph(gm, args)
    tracker = StorageTracker(args)
    sampler = TrackerSampler(tracker)
    torch.manual_seed(0)
    with torch.no_grad(), tracker:
        StepInterpreter(gm, sampler).run(*args)
    ref = carry_forward(sampler.samples, len(gm.graph.nodes)) + live_at_start(args, gm, "cpu")
    ran = sorted(sampler.samples)  # steps with an op (placeholders have none)
    assert (meas["measured"].to_numpy()[ran] == ref[ran]).all()


def _raw_peak(fn):
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True)
    with prof, torch.no_grad():
        fn()
    from torch._C._profiler import _EventType

    ev = [e for e in _walk(prof.profiler.kineto_results.experimental_event_tree())
          if e.tag == _EventType.Allocation]
    live = peak = 0
    for e in sorted(ev, key=lambda e: e.start_time_ns):
        live += e.extra_fields.alloc_size
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("name", ["cnn_bn", "tiny_lm"])
def test_interpreter_frees_like_generated_code(name):
    joint, args = _setup(name)
    gm = joint.graph_module
    base = live_at_start(args, gm, "cpu")
    torch.manual_seed(0)
    codegen = _raw_peak(lambda: gm(*args))
    torch.manual_seed(0)
    meas = measure_graph(gm, args)
    assert int(meas["measured_total"].max()) - base == codegen


def test_conv_workspace_is_its_own_line():
    joint, args = _setup("cnn_bn")
    meas = measure_graph(joint.graph_module, args)
    conv_steps = [i for i, n in enumerate(joint.graph.nodes) if "convolution" in n.name]
    assert meas["workspace"].to_numpy()[conv_steps].max() > 0
    assert (meas["measured_total"] >= meas["measured"]).all()
    assert meas["workspace"].max() >= int(meas["measured_total"].max() - meas["measured"].max())


def test_live_at_start_counts_shared_storage_once():
    w = torch.randn(10, 10)
    gm = torch.fx.symbolic_trace(lambda a, b: a + b)
    assert live_at_start([w, w[0]], gm, "cpu") == 400
    assert live_at_start([w, w[0]], gm, "cuda") == 512


def test_failing_node_is_named():
    gm = torch.fx.symbolic_trace(lambda a, b: torch.mm(a, b))
    with pytest.raises(NodeExecutionError, match="mm"):
        measure_graph(gm, [torch.randn(2, 3), torch.randn(2, 3)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["mlp", "tiny_lm", "gpt2_small"])
def test_cuda_peak_within_one_percent(name):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model().cuda(), f.make_inputs(4)
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    joint = jl.trace(model, f.train_fn, inputs)
    prof = joint.memory(model, inputs)
    assert prof.device == "cuda"
    assert abs(prof.peak_error) <= 0.01, (prof.peak_bytes, prof.measured_peak_bytes)
