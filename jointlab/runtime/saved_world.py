"""The world a saved graph's collectives ran in, and the runtime that checks it on load.

A graph with functional collectives names process groups by their names
(``"0"``, ``"1"``...), which only mean something inside the world that traced
it. :func:`jointlab.io.persist.save` stores a :class:`SavedWorld` beside such
a graph: the world size, the ranks of each group its collectives name, their
mesh dimensions, and for a graph traced from DTensor state the facts of each
DTensor input (local and global shape, placements, mesh dimension) and of each
DTensor gradient. The loaded graph gets a :class:`WorldRuntime`, so it can be
viewed anywhere (tables, DAG, collectives, memory), and runs only where the
world has that size and each named group holds the same ranks: otherwise
running is refused (``StateMismatchError``), because a collective over another
group would give another answer that looks right.

A DTensor graph is fed the local shards of the live model's DTensors: each is
checked against the saved facts first, and the gradients are wrapped back in
the layout of their parameter (refused when the trace's gradient had another).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from jointlab import torch_compat as compat
from jointlab.errors import StateMismatchError
from jointlab.runtime.dtensor import AotDTensorRuntime, DTensorRuntime, ShardSpec, is_dtensor
from jointlab.runtime.plans import AotRuntime, MakeFxRuntime

__all__ = ["SHARD_KEYS", "SavedWorld", "WorldRuntime", "collective_groups", "group_name"]

#: ``ShardSpec.describe`` keys a live DTensor must match to feed a loaded graph.
SHARD_KEYS = ("local_shape", "global_shape", "placement", "mesh_dim")


def group_name(node: torch.fx.Node) -> str:
    """The process-group name a collective node runs on: its last string argument ("" if none)."""
    names = [a for a in node.args if isinstance(a, str)]
    return names[-1] if names else ""


def collective_groups(gm: torch.fx.GraphModule) -> list[str]:
    """The process-group names the graph's functional collectives run on, in graph order."""
    names: list[str] = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and compat.is_functional_collective(node.target):
            group = group_name(node)
            if group and group not in names:
                names.append(group)
    return names


def _shard_facts(spec: ShardSpec | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    facts = spec.describe()
    return {k: facts[k] for k in SHARD_KEYS}


@dataclass(frozen=True)
class SavedWorld:
    """What a graph with collectives needs of the world it runs in (plain data).

    Attributes:
        world_size: The number of ranks it was traced in.
        groups: Each process-group name its collectives use, to that group's world ranks.
        group_dims: Process-group name to mesh dimension name (DTensor traces).
        rank_classes: The ranks that share the graph's local shapes (DTensor traces), or None.
        state: Per state placeholder, its FQN and the facts of its DTensor (None: a plain
            tensor); empty for a graph not traced from DTensor state.
        grads: Parameter FQN to the facts of its DTensor gradient.
    """

    world_size: int
    groups: dict[str, tuple[int, ...]]
    group_dims: dict[str, str] = field(default_factory=dict)
    rank_classes: tuple[tuple[int, ...], ...] | None = None
    state: list[dict[str, Any] | None] = field(default_factory=list)
    grads: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, runtime: Any) -> SavedWorld | None:
        """The world of a live graph (None when it has no collectives and no DTensor state).

        Raises:
            StateMismatchError: It has collectives but no process group is initialised
                (save it inside the world that traced it).
        """
        if isinstance(runtime, WorldRuntime):
            return runtime.world
        names = collective_groups(gm)
        dtensor = isinstance(runtime, DTensorRuntime)
        if not names and not dtensor:
            return None
        import torch.distributed as dist

        if not dist.is_initialized():
            raise StateMismatchError(
                f"the graph's collectives run on process groups {names}, but no process group "
                "is initialised now, so jointlab cannot record which ranks they hold. Save it "
                "inside the world that traced it (jl.fake_world or the real job).")
        groups = {n: compat.group_ranks(n) for n in names}
        missing = [n for n, r in groups.items() if r is None]
        if missing:
            raise StateMismatchError(f"the graph's collectives name process groups {missing}, "
                                     "which this world does not hold: save it in the world "
                                     "that traced it.")
        if not dtensor:
            return cls(dist.get_world_size(), groups)
        return cls(dist.get_world_size(), groups, dict(runtime.group_dims),
                   runtime.rank_classes,
                   [None if s is None else {"fqn": s.fqn, **_shard_facts(s)}
                    for s in runtime.specs],
                   {n: _shard_facts(s) for n, s in runtime.grads.items()})

    def describe(self) -> str:
        """The world in words, for messages."""
        groups = ", ".join(f"'{n}': ranks {list(r)}" for n, r in self.groups.items())
        return f"a {self.world_size}-rank world (process groups {groups or 'none'})"

    def check(self, where: str = "This loaded graph") -> None:
        """Refuse running outside a world of the same size whose named groups hold the same ranks.

        Raises:
            StateMismatchError: No process group, another world size, or a group that is
                missing or holds other ranks.
        """
        import torch.distributed as dist

        here = ("no process group is initialised here" if not dist.is_initialized() else
                f"this world has {dist.get_world_size()} ranks")
        if not dist.is_initialized() or dist.get_world_size() != self.world_size:
            raise StateMismatchError(
                f"{where} was traced in {self.describe()}, but {here}: its collectives "
                f"would run over other ranks. Run it inside jl.fake_world({self.world_size}) "
                f"(the same mesh) or a real job of {self.world_size} ranks; it can be viewed "
                "(tables, DAG, collectives, memory) anywhere.")
        for name, ranks in self.groups.items():
            live = compat.group_ranks(name)
            if live != ranks:
                got = "no such group" if live is None else f"ranks {list(live)}"
                raise StateMismatchError(
                    f"{where} runs collectives on process group '{name}' of ranks "
                    f"{list(ranks)}, but here '{name}' is {got}: build the same mesh (same "
                    "dimensions, created in the same order) as the world that traced it.")


def _live_spec(fqn: str, facts: dict[str, Any], t: Any) -> ShardSpec:
    """The live DTensor's spec, refused unless it matches what the graph was traced for."""
    if not is_dtensor(t):
        raise StateMismatchError(f"'{fqn}' cannot feed this loaded graph: it is a plain "
                                 f"{type(t).__name__}, but it was traced as a DTensor "
                                 f"({facts['placement']}).")
    spec = ShardSpec.of(fqn, t)
    live = _shard_facts(spec)
    if live != facts:
        diff = {k: (live[k], facts[k]) for k in SHARD_KEYS if live[k] != facts[k]}
        raise StateMismatchError(
            f"'{fqn}' cannot feed this loaded graph: " + "; ".join(
                f"its {k} is {a!r} here but was {b!r} when traced" for k, (a, b) in diff.items())
            + ". Run it on the model it was traced from (same mesh and plan, same rank).")
    return spec


class WorldRuntime:
    """Runtime of a loaded graph with collectives: runs only inside its world.

    Attributes:
        world: The :class:`SavedWorld` it was traced in.
        plan: The mode's plain runtime (``MakeFxRuntime`` or the ``AotRuntime`` plan).
    """

    def __init__(self, world: SavedWorld, plan: MakeFxRuntime | AotRuntime) -> None:
        """Hold the saved world and the mode's plan."""
        self.world = world
        self.plan = plan

    @property
    def group_dims(self) -> dict[str, str]:
        """Process-group name to mesh dimension name, as traced."""
        return dict(self.world.group_dims)

    @property
    def rank_classes(self) -> tuple[tuple[int, ...], ...] | None:
        """The ranks that shared the graph's local shapes when traced (DTensor traces)."""
        return self.world.rank_classes

    def _live(self, flat: list[torch.Tensor]) -> Any:
        """The runtime for these live tensors, after the world and each DTensor are checked."""
        self.world.check()
        if not self.world.state:
            return self.plan
        specs = [None if f is None else _live_spec(f["fqn"], f["facts"], flat[i])
                 for i, f in enumerate(self._state_facts())]
        by_fqn = {s.fqn: s for s in specs if s is not None}
        grads = {}
        for fqn, facts in self.world.grads.items():
            spec = by_fqn.get(fqn)
            if spec is None or _shard_facts(spec) != facts:
                raise StateMismatchError(
                    f"this loaded graph's gradient of '{fqn}' was a DTensor placed "
                    f"({facts['placement']}), not in its parameter's layout, which jointlab "
                    "cannot rebuild from a saved graph: trace the model again to run it.")
            grads[fqn] = spec
        if isinstance(self.plan, AotRuntime):
            return AotDTensorRuntime(self.plan, specs, grads)
        return DTensorRuntime(specs, grads)

    def _state_facts(self) -> list[dict[str, Any] | None]:
        return [None if f is None else {"fqn": f["fqn"], "facts": {k: f[k] for k in SHARD_KEYS}}
                for f in self.world.state]

    def check_feed(self, flat: list[torch.Tensor]) -> None:
        """Refuse running outside the graph's world or with DTensors placed otherwise.

        Raises:
            StateMismatchError: See :meth:`SavedWorld.check` and the DTensor checks.
        """
        self._live(flat)

    def prepare(self, joint: Any, flat: list[torch.Tensor]) -> list[Any]:
        """Check the world, then lay the inputs out as the graph takes them."""
        return self._live(flat).prepare(joint, flat)

    def finish(self, joint: Any, outputs: list[Any], flat: list[torch.Tensor]
               ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Split the outputs (gradients of DTensor parameters wrapped back as DTensors)."""
        return self._live(flat).finish(joint, outputs, flat)
