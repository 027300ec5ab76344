"""Plug-ins: what jointlab knows about one library or kernel family, each in one module.

The generic tracer names no model family. Each plug-in module here holds
everything about one (its refusals, guards, swaps and records) as rows of the
watch table (:class:`jointlab.trace.watch_table.Watch`), with ``NAME``,
``ROWS`` and ``AFTER`` (the table row its rows follow), and optionally
``KV_CACHE``-like :class:`~jointlab.runtime.constants.LibraryConstant` in
``CONSTANTS`` (empty constants its library's code makes, named with the fix). Importing this package
registers the built-in ones (``import jointlab`` does); a plug-in's modules
load nothing of its library (transformers is read from ``sys.modules`` only).

- :mod:`jointlab.plugins.transformers`: Hugging Face transformers;
- :mod:`jointlab.plugins.mha_fast_path`: ``nn.MultiheadAttention``'s fused fast path;
- :mod:`jointlab.plugins.onednn_rnn`: RNN layers through eager's kernels (oneDNN's LSTM
  layer retargeted to keep its workspace: a row's ``retargets``).

``with watch_table.unregistered("transformers"):`` traces without one; a new
plug-in is a module with the three names, registered with :func:`register`.
"""

from __future__ import annotations

from types import ModuleType

from jointlab.plugins import mha_fast_path, onednn_rnn, transformers
from jointlab.runtime.constants import register_library_constants
from jointlab.trace import watch_table

__all__ = ["BUILTIN", "register"]

#: The built-in plug-ins, registered in this order.
BUILTIN: tuple[ModuleType, ...] = (transformers, onednn_rnn, mha_fast_path)


def register(plugin: ModuleType) -> None:
    """Register a plug-in module's rows (its ``NAME``, ``ROWS`` and ``AFTER``) and constants.

    Args:
        plugin: The plug-in's module.
    """
    watch_table.register(plugin.NAME, plugin.ROWS, after=plugin.AFTER)
    register_library_constants(plugin.NAME, getattr(plugin, "CONSTANTS", ()))


for _plugin in BUILTIN:
    register(_plugin)
