"""The torch versions jointlab is tested on, and what it says about the others.

jointlab declares ``torch>=2.13`` with no upper cap, so installing it (for
example from a notebook's setup cell on Colab) never replaces the host's torch.
In exchange it says plainly what it does not know:

* ``import jointlab`` warns once (:class:`~jointlab.errors.UntestedTorchWarning`)
  when torch is outside the tested versions;
* every private torch API jointlab uses is reached through :func:`torch_module`,
  :func:`torch_attr` or :func:`unsupported`, so a torch that lacks one raises
  :class:`~jointlab.errors.UnsupportedTorchError` naming the API, the torch
  version and the tested versions, instead of an ``ImportError`` from deep inside.

This module imports nothing beyond torch, so ``import jointlab`` stays light.
"""

from __future__ import annotations

import importlib
import re
import warnings
from types import ModuleType
from typing import Any

import torch

from jointlab.errors import UnsupportedTorchError, UntestedTorchWarning

#: Oldest and newest torch releases the whole test suite passed on.
OLDEST_TESTED = (2, 13, 0)
NEWEST_TESTED = (2, 14, 1)

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_warned = False


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


def untested_message(version: str) -> str:
    """The warning text for an untested torch ``version``."""
    side = "newer" if release(version) > NEWEST_TESTED else "older"
    return (
        f"jointlab is tested with torch {TESTED}; this is torch {version}, {side}. "
        "jointlab relies on private torch APIs: where one is missing it raises "
        "jointlab.errors.UnsupportedTorchError, but where one changed its behaviour the "
        "results are unverified. Check a trace against eager autograd with jl.compare "
        "before you rely on it, or install a tested torch. Silence this warning with "
        "warnings.filterwarnings('ignore', category=jointlab.errors.UntestedTorchWarning).")


def warn_if_untested(version: str | None = None) -> bool:
    """Warn once per process when torch is outside the tested versions.

    Args:
        version: The torch version to check; defaults to the installed one.

    Returns:
        True when this call issued the warning.
    """
    global _warned
    version = torch.__version__ if version is None else version
    if _warned or is_tested(version):
        return False
    _warned = True
    warnings.warn(untested_message(version), UntestedTorchWarning, stacklevel=2)
    return True


def unsupported(api: str, purpose: str) -> UnsupportedTorchError:
    """The error for a torch that lacks ``api``, which jointlab needs for ``purpose``.

    Args:
        api: The missing torch name, e.g. ``"torch.compiler._patch_engine_backward"``.
        purpose: What jointlab needs it for, completing "which jointlab needs to ...".

    Returns:
        The error to raise (chain torch's own with ``raise ... from exc``).
    """
    return UnsupportedTorchError(
        f"torch {torch.__version__} has no {api}, which jointlab needs to {purpose}. "
        f"jointlab is tested with torch {TESTED}: install one of those "
        f"(pip install 'torch=={_dotted(NEWEST_TESTED)}').")


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
