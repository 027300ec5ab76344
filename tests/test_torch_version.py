"""The torch range policy: no upper cap, one warning on an untested torch, clear errors."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
from packaging.requirements import Requirement

import jointlab as jl
from jointlab import torch_compat as _torch_version
from jointlab.trace import checkpoint as _checkpoint
from tests.util import assert_unchanged, deep_state

tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _torch_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    return req


def test_range_never_forces_a_downgrade_of_a_newer_torch():
    spec = _torch_requirement().specifier
    # a host's newer torch (Colab's) satisfies it, so pip keeps it
    for newer in ("2.15.0", "2.15.0+cu130", "2.16.1", "3.0.0"):
        assert spec.contains(newer), (str(spec), newer)
    assert spec.contains("2.13.0") and not spec.contains("2.12.1")


def test_installed_torch_is_a_tested_one():
    assert _torch_version.is_tested(torch.__version__), torch.__version__


@pytest.mark.parametrize(("version", "tested"), [
    ("2.13.0", True), ("2.13.0+cpu", True), ("2.14.1+cu130", True), ("2.14.0", True),
    ("2.14.2", False), ("2.15.0", False), ("2.15.0.dev20261001+cu130", False),
    ("2.12.1", False), ("3.0", False)])
def test_tested_range(version, tested):
    assert _torch_version.is_tested(version) is tested


def test_untested_torch_warns_once_naming_both_versions(monkeypatch):
    monkeypatch.setattr(_torch_version, "_warned", False)
    with pytest.warns(jl.errors.UntestedTorchWarning) as record:
        assert _torch_version.warn_if_untested("2.15.0+cu130") is True
        assert _torch_version.warn_if_untested("2.15.0+cu130") is False
    assert len(record) == 1
    msg = str(record[0].message)
    assert "torch 2.15.0+cu130, newer" in msg and "2.13.0 to 2.14.1" in msg
    assert "jl.compare" in msg


def test_tested_torch_does_not_warn(monkeypatch):
    monkeypatch.setattr(_torch_version, "_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _torch_version.warn_if_untested("2.14.1") is False


def test_import_warns_on_an_untested_torch_and_not_on_this_one():
    code = ("import warnings, torch; {patch}warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import jointlab\n"
            "print(sum(issubclass(x.category, jointlab.errors.UntestedTorchWarning) for x in w))")
    for patch, expected in (("", "0"), ("torch.__version__ = '2.99.0'; ", "1")):
        out = subprocess.run([sys.executable, "-c", code.format(patch=patch)], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stdout + out.stderr


def test_missing_private_module_is_a_clear_jointlab_error():
    with pytest.raises(jl.errors.UnsupportedTorchError) as info:
        _torch_version.torch_module("torch._no_such_module", "read AOT descriptors")
    msg = str(info.value)
    assert f"torch {torch.__version__} has no torch._no_such_module" in msg
    assert "read AOT descriptors" in msg and "2.13.0 to 2.14.1" in msg
    assert isinstance(info.value.__cause__, ImportError)
    with pytest.raises(jl.errors.UnsupportedTorchError, match="torch.fx.no_such_name"):
        _torch_version.torch_attr("torch.fx", "no_such_name", "trace")


def test_import_names_the_missing_torch_module():
    # a torch whose private module is gone: jointlab's import says so, not an ImportError
    code = ("import sys, torch\n"
            "sys.modules['torch.fx.experimental.symbolic_shapes'] = None\n"
            "import jointlab")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert "jointlab.errors.UnsupportedTorchError" in out.stderr, out.stderr[-2000:]
    missing = f"torch {torch.__version__} has no torch.fx.experimental.symbolic_shapes"
    assert missing in out.stderr, out.stderr[-2000:]


def test_checkpoint_region_counter_missing_is_a_clear_error(monkeypatch):
    for name in ("_checkpoint_without_reentrant_generator_impl",
                 "_checkpoint_without_reentrant_generator"):
        monkeypatch.setattr(_checkpoint.torch_checkpoint, name, None, raising=False)
    with pytest.raises(jl.errors.UnsupportedTorchError, match="count checkpointed regions"):
        with _checkpoint.checkpoint_tracing():
            pass


def _small_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    inputs = {"x": torch.randn(5, 3), "y": torch.randn(5, 1)}
    return model, (lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)), inputs


def test_trace_without_the_engine_patch_refuses(monkeypatch):
    # without it no backward node is tagged; a structural guess would misplace nodes
    model, train_fn, inputs = _small_step()
    before = deep_state(model)
    monkeypatch.delattr(torch.compiler, "_patch_engine_backward")
    with pytest.raises(jl.errors.UnsupportedTorchError,
                       match=r"has no torch\.compiler\._patch_engine_backward"):
        jl.trace(model, train_fn, inputs)
    assert_unchanged(before, model)


def test_measure_without_the_kineto_event_tree_refuses(monkeypatch):
    model, train_fn, inputs = _small_step()
    joint = jl.trace(model, train_fn, inputs)
    monkeypatch.delattr(torch._C._profiler, "_EventType")
    with pytest.raises(jl.errors.UnsupportedTorchError, match="_EventType"):
        joint.memory(model, inputs)
