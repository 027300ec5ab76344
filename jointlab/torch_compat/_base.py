"""The torch-version policy and lazy private-name table that jointlab.torch_compat builds on.

The tested torch versions, :func:`unsupported` (the error every guarded
accessor raises when this torch lacks an API), :func:`torch_module` and
:func:`torch_attr` (guarded imports), and :data:`PRIVATE`, the private torch
names resolved on first use. Only the modules of :mod:`jointlab.torch_compat`
import it; everything else imports from the package.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

import torch

from jointlab.errors import UnsupportedTorchError

#: Oldest and newest torch releases the whole test suite passed on (2.11.0, Colab's;
#: 2.12.1; 2.13.0; 2.14.1; 2.15.0). On 2.11 and 2.12 the default trace works through
#: torch_compat.backport; simulated worlds and DTensor tracing refuse there, naming 2.13,
#: and their tests skip, saying so.
OLDEST_TESTED = (2, 11, 0)
NEWEST_TESTED = (2, 15, 0)

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


TESTED = f"{_dotted(OLDEST_TESTED)} to {_dotted(NEWEST_TESTED)}"


def release(version: str) -> tuple[int, int, int]:
    """The ``(major, minor, micro)`` release of a torch version string.

    Args:
        version: A version such as ``"2.14.1+cu130"`` or ``"2.16.0.dev20261101"``.

    Returns:
        The release numbers; local (``+cpu``) and pre-release parts are dropped.

    Raises:
        ValueError: ``version`` does not start with a release number.
    """
    match = _RELEASE.match(str(version))
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    major, minor, micro = match.groups()
    return int(major), int(minor), int(micro or 0)


def is_tested(version: str) -> bool:
    """Whether ``version``'s release lies in the tested range (bounds included)."""
    return OLDEST_TESTED <= release(version) <= NEWEST_TESTED


def on_hosted_notebook() -> bool:
    """Whether this is a hosted notebook whose torch came with it (Colab, Kaggle).

    There, replacing torch means a multi-GB download and a runtime restart, and
    the host's torchvision/torchaudio are pinned to its torch: advice never says
    to install another torch.
    """
    import os
    import sys

    return "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def untested_message(version: str) -> str:
    """The warning text for an untested torch ``version``."""
    side = "newer" if release(version) > NEWEST_TESTED else "older"
    advice = ("keep this notebook's torch (replacing it here is a multi-GB download and a "
              "runtime restart) and check a trace against eager autograd with jl.compare "
              "before you rely on it" if on_hosted_notebook() else
              "check a trace against eager autograd with jl.compare before you rely on it, "
              "or use a tested torch")
    return (
        f"jointlab is tested with torch {TESTED}; this is torch {version}, {side}. "
        "Where a private torch API jointlab uses is missing it raises "
        "jointlab.errors.UnsupportedTorchError; where one changed its behaviour the results "
        f"are unverified: {advice}. Silence this with warnings.filterwarnings('ignore', "
        "category=jointlab.errors.UntestedTorchWarning).")


def unsupported(api: str, purpose: str, since: str | None = None) -> UnsupportedTorchError:
    """The error for a torch that lacks ``api``, which jointlab needs for ``purpose``.

    Args:
        api: The missing torch name, e.g. ``"torch.compiler._patch_engine_backward"``.
        purpose: What jointlab needs it for, completing "which jointlab needs to ...".
        since: The first torch release that has it, when known (``"2.13"``).

    Returns:
        The error to raise (chain torch's own with ``raise ... from exc``).
    """
    need = (f"torch {since} or newer has it" if since
            else f"jointlab is tested with torch {TESTED}")
    if on_hosted_notebook():
        advice = ("the rest of jointlab works with this notebook's torch; keep it (replacing "
                  "it here is a multi-GB download and a runtime restart)")
    else:
        advice = f"pip install 'torch=={_dotted(NEWEST_TESTED)}' to use it"
    return UnsupportedTorchError(
        f"torch {torch.__version__} has no {api}, which jointlab needs to {purpose}; "
        f"{need}: {advice}.")


def torch_module(name: str, purpose: str) -> ModuleType:
    """Import the (private) torch module ``name`` or raise :func:`unsupported`'s error.

    Args:
        name: The dotted module name, e.g. ``"torch._functorch._aot_autograd.descriptors"``.
        purpose: What jointlab needs it for.

    Returns:
        The module.

    Raises:
        UnsupportedTorchError: This torch has no such module.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise unsupported(name, purpose) from exc


def torch_attr(module: str, name: str, purpose: str) -> Any:
    """``module.name`` from a (private) torch module, or raise :func:`unsupported`'s error.

    Args:
        module: The dotted module name.
        name: The attribute to read from it.
        purpose: What jointlab needs it for.

    Returns:
        The attribute's value.

    Raises:
        UnsupportedTorchError: This torch has no such module or attribute.
    """
    value = getattr(torch_module(module, purpose), name, None)
    if value is None:
        raise unsupported(f"{module}.{name}", purpose)
    return value


# -- private names, imported on first use -----------------------------------------
_PROXY = "torch.fx.experimental.proxy_tensor"
_SHAPES = "torch.fx.experimental.symbolic_shapes"
_FAKE = "trace with fake tensors"

#: ``name: (torch module, attribute or None for the module itself, what for)``.
PRIVATE: dict[str, tuple[str, str | None, str]] = {
    "pytree": ("torch.utils._pytree", None, "flatten nested inputs and outputs"),
    "sympy_functions": ("torch.utils._sympy.functions", None, "load symbolic shapes"),
    "int_oo": ("torch.utils._sympy.numbers", "int_oo", "load symbolic shapes"),
    "OpOverload": ("torch._ops", "OpOverload", "recognise ATen operators"),
    "FakeTensor": ("torch._subclasses", "FakeTensor", _FAKE),
    "FakeTensorMode": ("torch._subclasses", "FakeTensorMode", _FAKE),
    "DataDependentOutputException": ("torch._subclasses.fake_tensor",
                                     "DataDependentOutputException", _FAKE),
    "DynamicOutputShapeException": ("torch._subclasses.fake_tensor",
                                    "DynamicOutputShapeException", _FAKE),
    "FunctionalTensor": ("torch._subclasses.functional_tensor", "FunctionalTensor",
                         "see through AOT's functional tensors"),
    "sync_functional": ("torch", "_sync", "see through AOT's functional tensors"),
    "from_functional_tensor": ("torch", "_from_functional_tensor",
                               "see through AOT's functional tensors"),
    "TracingContext": ("torch._guards", "TracingContext", _FAKE),
    "tracing": ("torch._guards", "tracing", _FAKE),
    "TorchDispatchMode": ("torch.utils._python_dispatch", "TorchDispatchMode",
                          "watch the aten ops train_fn runs"),
    "enable_python_dispatcher": ("torch._dispatch.python", "enable_python_dispatcher",
                                 "trace with dynamic shapes"),
    "make_fx": (_PROXY, "make_fx", "trace a training step"),
    "get_proxy_mode": (_PROXY, "get_proxy_mode", "trace a training step"),
    "get_innermost_proxy_mode": (_PROXY, "get_innermost_proxy_mode", "probe module outputs"),
    "get_proxy_slot": (_PROXY, "get_proxy_slot", "probe module outputs"),
    "DimDynamic": (_SHAPES, "DimDynamic", "trace with dynamic shapes"),
    "ShapeEnv": (_SHAPES, "ShapeEnv", "trace with dynamic shapes"),
    "StatelessSymbolicContext": (_SHAPES, "StatelessSymbolicContext",
                                 "trace with dynamic shapes"),
    "GuardOnDataDependentSymNode": (_SHAPES, "GuardOnDataDependentSymNode",
                                    "explain data-dependent branches"),
    "reparametrize_module": ("torch.nn.utils.stateless", "_reparametrize_module",
                             "trace with the parameters as graph inputs"),
    "FakeStore": ("torch.testing._internal.distributed.fake_pg", "FakeStore",
                  "simulate a distributed world with the fake process group"),
    "TorchLocalTensorMode": ("torch.distributed._local_tensor", "LocalTensorMode",
                        "run every rank of a simulated world in one process"),
    "LocalTensor": ("torch.distributed._local_tensor", "LocalTensor",
                    "run every rank of a simulated world in one process"),
    "LOCAL_TENSOR_MESH_METHODS": ("torch.distributed._local_tensor",
                                  "_PATCHED_DEVICE_MESH_METHODS",
                                  "make the device mesh report the rank being traced"),
    "inductor_compile": ("torch._inductor", "compile",
                         "compile the joint graph itself and map its kernels onto it"),
    "sdp_priority_order": ("torch._C", "_get_sdp_priority_order",
                           "guard the order SDPA tried its kernels in when traced"),
    "build_memory_profile": ("torch._inductor.fx_passes.memory_estimator",
                             "build_memory_profile",
                             "cross-check the memory prediction against Inductor's estimator"),
}


_RESOLVED: dict[str, Any] = {}


def resolve(name: str) -> Any:
    """The value of a name of :data:`PRIVATE`, imported on first use and then kept.

    Raises:
        AttributeError: ``name`` is not one of :data:`PRIVATE`.
        UnsupportedTorchError: This torch lacks the module or attribute.
    """
    if name in _RESOLVED:
        return _RESOLVED[name]
    spec = PRIVATE.get(name)
    if spec is None:
        raise AttributeError(f"module 'jointlab.torch_compat' has no attribute {name!r}")
    module, attr, purpose = spec
    value = torch_module(module, purpose) if attr is None else torch_attr(module, attr, purpose)
    _RESOLVED[name] = value
    return value


def required(obj: Any, attr: str, api: str, purpose: str, since: str | None = None) -> Any:
    """``obj.attr``, or :func:`unsupported`'s error naming ``api`` (and ``since``)."""
    value = getattr(obj, attr, None)
    if value is None:
        raise unsupported(api, purpose, since)
    return value


def is_generator_argument_error(exc: BaseException) -> bool:
    """True for make_fx's refusal of a ``torch.Generator`` argument (torch 2.11 and 2.12).

    Those releases' proxy tensor mode cannot take a Generator argument at all and
    say so naming the private ``torch._C.Generator`` type; 2.13 records the
    generator as a graph constant instead.

    Args:
        exc: The error make_fx raised.

    Returns:
        Whether it is that refusal.
    """
    return isinstance(exc, NotImplementedError) and "torch._C.Generator" in str(exc)


def is_real_tensor_in_fake_trace_error(exc: BaseException) -> bool:
    """True for torch's refusal of a real tensor met while tracing with fake tensors.

    AOT's export asserts "Please convert all Tensors to FakeTensors first" when the
    traced code uses a tensor that is no parameter, buffer or input (a plain tensor
    attribute, a captured one); torch 2.11 to 2.15 word it so.

    Args:
        exc: The error the trace raised.

    Returns:
        Whether it is that refusal.
    """
    return "Please convert all Tensors to FakeTensors first" in str(exc)
