"""The one place jointlab touches private torch APIs, and its torch-version policy.

jointlab declares ``torch>=2.11`` (Colab's) with no upper cap, so installing it (for
example from a notebook's setup cell on Colab) never replaces the host's torch.
In exchange it says plainly what it does not know:

* ``import jointlab`` warns once (:class:`~jointlab.errors.UntestedTorchWarning`)
  when torch is outside the tested versions;
* every private torch API jointlab uses is reached through this package: the
  names in :data:`PRIVATE` (``from jointlab.torch_compat import FakeTensorMode``),
  the accessors below (:func:`op_schema`, :func:`storage_id`, ...), or
  :func:`torch_module` / :func:`torch_attr` / :func:`unsupported`. A torch that
  lacks one raises :class:`~jointlab.errors.UnsupportedTorchError` naming the
  API, the torch version and the tested versions, instead of an ``ImportError``
  (or a silently different result) from deep inside. ``tests/test_torch_version.py``
  fails on a private torch name used anywhere else in ``jointlab/``.

The accessors live in eight modules, all re-exported here:
:mod:`~jointlab.torch_compat.fake_checks` (a fake mode that checks each op first),
:mod:`~jointlab.torch_compat.ops` (private ATen overloads and op namespaces),
:mod:`~jointlab.torch_compat.aot` (AOT's joint export and backward marks, its descriptors,
the partitioners),
:mod:`~jointlab.torch_compat.graphs` (ops, FX graphs, fake tensors, tracing,
the profiler, checkpointing), :mod:`~jointlab.torch_compat.distributed`
(meshes, ``LocalTensor``, FSDP2's memory tracker, AOT subclass metadata),
:mod:`~jointlab.torch_compat.every_rank` (the ``LocalTensorMode`` of every rank at
once, with exact collectives of plain tensors) and
:mod:`~jointlab.torch_compat.inductor` (kernel provenance and the one codegen
hook), :mod:`~jointlab.torch_compat.inductor_state` (the configuration, lowerings
and decompositions a compile used, recorded and restored); the version policy
and :data:`PRIVATE` are in
:mod:`~jointlab.torch_compat._base`. The package imports nothing beyond torch,
and the names in :data:`PRIVATE` are imported on first use, so ``import
jointlab`` stays light.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from jointlab.errors import UntestedTorchWarning
from jointlab.torch_compat._base import NEWEST_TESTED as NEWEST_TESTED
from jointlab.torch_compat._base import OLDEST_TESTED as OLDEST_TESTED
from jointlab.torch_compat._base import PRIVATE as PRIVATE
from jointlab.torch_compat._base import TESTED as TESTED
from jointlab.torch_compat._base import is_generator_argument_error as is_generator_argument_error
from jointlab.torch_compat._base import (
    is_real_tensor_in_fake_trace_error as is_real_tensor_in_fake_trace_error,
)
from jointlab.torch_compat._base import is_tested as is_tested
from jointlab.torch_compat._base import release as release
from jointlab.torch_compat._base import resolve
from jointlab.torch_compat._base import torch_attr as torch_attr
from jointlab.torch_compat._base import torch_module as torch_module
from jointlab.torch_compat._base import unsupported as unsupported
from jointlab.torch_compat._base import untested_message as untested_message
from jointlab.torch_compat.aot import MARKS_ENGINE_BACKWARD_IN_AOT as MARKS_ENGINE_BACKWARD_IN_AOT
from jointlab.torch_compat.aot import Partitioners as Partitioners
from jointlab.torch_compat.aot import aot_backward_marks as aot_backward_marks
from jointlab.torch_compat.aot import aot_descriptors as aot_descriptors
from jointlab.torch_compat.aot import aot_export_joint as aot_export_joint
from jointlab.torch_compat.aot import partitioners as partitioners
from jointlab.torch_compat.distributed import aot_grad_subclass_metas as aot_grad_subclass_metas
from jointlab.torch_compat.distributed import backward_node_name as backward_node_name
from jointlab.torch_compat.distributed import clear_dtensor_caches as clear_dtensor_caches
from jointlab.torch_compat.distributed import coordinate_reader as coordinate_reader
from jointlab.torch_compat.distributed import fsdp_mem_tracker as fsdp_mem_tracker
from jointlab.torch_compat.distributed import fsdp_module_class as fsdp_module_class
from jointlab.torch_compat.distributed import group_ranks as group_ranks
from jointlab.torch_compat.distributed import loss_parallel_active as loss_parallel_active
from jointlab.torch_compat.distributed import loss_parallel_entry as loss_parallel_entry
from jointlab.torch_compat.distributed import mesh_coordinates as mesh_coordinates
from jointlab.torch_compat.distributed import mesh_rank_methods as mesh_rank_methods
from jointlab.torch_compat.distributed import opaque_real_object as opaque_real_object
from jointlab.torch_compat.distributed import per_rank_values as per_rank_values
from jointlab.torch_compat.distributed import (
    require_distributed_tracing as require_distributed_tracing,
)
from jointlab.torch_compat.distributed import root_mesh as root_mesh
from jointlab.torch_compat.distributed import subclass_creation_parts as subclass_creation_parts
from jointlab.torch_compat.every_rank import LocalTensorMode as LocalTensorMode
from jointlab.torch_compat.every_rank import every_rank_mode as every_rank_mode
from jointlab.torch_compat.every_rank import (
    every_rank_mode_active as every_rank_mode_active,
)
from jointlab.torch_compat.fake_checks import checking_fake_mode as checking_fake_mode
from jointlab.torch_compat.fake_checks import fake_mode_check as fake_mode_check
from jointlab.torch_compat.fake_checks import runs_checks as runs_checks
from jointlab.torch_compat.graphs import allocation_event_tag as allocation_event_tag
from jointlab.torch_compat.graphs import checkpoint_internals as checkpoint_internals
from jointlab.torch_compat.graphs import checkpoint_region_entry as checkpoint_region_entry
from jointlab.torch_compat.graphs import engine_backward_patch as engine_backward_patch
from jointlab.torch_compat.graphs import fake_tensor_maker as fake_tensor_maker
from jointlab.torch_compat.graphs import free_unused_values as free_unused_values
from jointlab.torch_compat.graphs import graph_codegen as graph_codegen
from jointlab.torch_compat.graphs import is_compiled_module as is_compiled_module
from jointlab.torch_compat.graphs import is_op_overload as is_op_overload
from jointlab.torch_compat.graphs import keep_stack_frames_of as keep_stack_frames_of
from jointlab.torch_compat.graphs import kineto_event_tree as kineto_event_tree
from jointlab.torch_compat.graphs import make_fx_joint_supported as make_fx_joint_supported
from jointlab.torch_compat.graphs import module_stores as module_stores
from jointlab.torch_compat.graphs import non_strict_tracing_context as non_strict_tracing_context
from jointlab.torch_compat.graphs import op_parts as op_parts
from jointlab.torch_compat.graphs import op_schema as op_schema
from jointlab.torch_compat.graphs import (
    post_accumulate_grad_hooks as post_accumulate_grad_hooks,
)
from jointlab.torch_compat.graphs import record_module_stack_of as record_module_stack_of
from jointlab.torch_compat.graphs import storage_id as storage_id
from jointlab.torch_compat.graphs import tensor_hooks as tensor_hooks
from jointlab.torch_compat.graphs import (
    without_python_decompositions as without_python_decompositions,
)
from jointlab.torch_compat.inductor import (
    FALLBACK_RANDOM_DRAWS_EAGER as FALLBACK_RANDOM_DRAWS_EAGER,
)
from jointlab.torch_compat.inductor import (
    complete_inductor_provenance as complete_inductor_provenance,
)
from jointlab.torch_compat.inductor import inductor_lifted_args as inductor_lifted_args
from jointlab.torch_compat.inductor import inductor_provenance as inductor_provenance
from jointlab.torch_compat.inductor import inductor_wrapper_globals as inductor_wrapper_globals
from jointlab.torch_compat.inductor import layout_copy_source as layout_copy_source
from jointlab.torch_compat.inductor_state import InductorState as InductorState
from jointlab.torch_compat.inductor_state import inductor_state as inductor_state
from jointlab.torch_compat.inductor_state import (
    inductor_state_applied as inductor_state_applied,
)
from jointlab.torch_compat.inductor_state import state_changes as state_changes
from jointlab.torch_compat.module_state import global_module_hooks as global_module_hooks
from jointlab.torch_compat.module_state import hook_dicts as hook_dicts
from jointlab.torch_compat.module_state import is_module_slot as is_module_slot
from jointlab.torch_compat.module_state import is_parameter_cache as is_parameter_cache
from jointlab.torch_compat.module_state import module_hooks as module_hooks
from jointlab.torch_compat.module_state import (
    module_internal_names as module_internal_names,
)
from jointlab.torch_compat.ops import COLLECTIVE_NAMESPACES as COLLECTIVE_NAMESPACES
from jointlab.torch_compat.ops import FUNCTIONAL_COLLECTIVES as FUNCTIONAL_COLLECTIVES
from jointlab.torch_compat.ops import batch_norm_legit_overloads as batch_norm_legit_overloads
from jointlab.torch_compat.ops import flop_formula as flop_formula
from jointlab.torch_compat.ops import is_collective_op as is_collective_op
from jointlab.torch_compat.ops import is_functional_collective as is_functional_collective

_warned = False


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


def __getattr__(name: str) -> Any:
    """Resolve a name of :data:`PRIVATE` on first use (``from jointlab.torch_compat import X``).

    Raises:
        AttributeError: ``name`` is not one of :data:`PRIVATE`.
        UnsupportedTorchError: This torch lacks the module or attribute.
    """
    return resolve(name)
