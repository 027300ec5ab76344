"""Notes torch prints that a student would read as errors, silenced at their cause and no wider.

* ``torch.utils.cpp_extension`` logs "No CUDA runtime is found, using CUDA_HOME=..."
  when a CUDA build of torch is imported on a machine without a GPU (Colab's CPU
  runtime) and Inductor's CPU backend imports it for ``joint.compile()``.
* torch before 2.13 warns "Profiler clears events at the end of each cycle" for every
  profiler made with ``acc_events=False``; ``joint.memory(model, inputs)`` on CPU runs
  one (notebook 01 showed it on Colab's torch 2.11).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import jointlab as jl

#: A fresh interpreter made to look like a CUDA build on a CPU host, CUDA_HOME set:
#: the state in which cpp_extension logs its note on import.
CUDA_BUILD_ON_CPU = textwrap.dedent("""
    import os, sys, torch
    os.environ["CUDA_HOME"] = sys.argv[1]
    torch.cuda._is_compiled = lambda: True
    torch.cuda.is_available = lambda: False  # no GPU on this host
    torch.version.cuda = "12.8"
    if sys.argv[2] == "jointlab":
        from jointlab.torch_compat.inductor import import_cpp_extension_quietly
        import_cpp_extension_quietly()
    import torch.utils.cpp_extension as c
    import logging
    logging.getLogger("torch.utils.cpp_extension").warning("later records still show")
    print("CUDA_HOME", c.CUDA_HOME)
""")


def _import_cpp_extension(how: str, cuda_home: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CUDA_BUILD_ON_CPU, cuda_home, how],
                          capture_output=True, text=True, timeout=120, check=True)


def test_cpp_extension_import_drops_only_the_no_cuda_runtime_note(tmp_path):
    plain = _import_cpp_extension("plain", str(tmp_path))
    assert "No CUDA runtime is found" in plain.stderr  # the reference: torch logs it
    quiet = _import_cpp_extension("jointlab", str(tmp_path))
    assert "No CUDA runtime is found" not in quiet.stderr
    assert "later records still show" in quiet.stderr  # the logger itself is not silenced
    assert f"CUDA_HOME {tmp_path}" in quiet.stdout  # the import itself is unchanged


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x).tanh()


def test_measured_memory_uses_one_accumulating_profiler_cycle(monkeypatch):
    """The CPU measurement's profiler keeps its events (``acc_events=True``), the setting
    whose absence torch 2.11 and 2.12 warn about; and measuring warns nothing here."""
    made = []
    real = torch.profiler.profile

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.profiler, "profile", spy)
    torch.manual_seed(0)
    model, inputs = _MLP(), {"x": torch.randn(5, 3)}
    joint = jl.trace(model, lambda m, x: F.mse_loss(m(x), torch.zeros(5, 4)), inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        joint.memory(model, inputs)
    assert made and all(k.get("acc_events") is True for k in made), made
