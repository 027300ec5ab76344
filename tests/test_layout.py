"""The package is a stack of layers: every import points down, no cycles, passes write meta.

The import graph is read from the source with ``ast``, so it counts what a
runtime check would miss: function-local imports, ``TYPE_CHECKING`` imports
and module names written as strings in the package's lazy tables (the same
rules as ``../shared/tools/import_cycles.py``). Every module belongs to one
layer of :data:`LAYERS` (the order ``DEVELOPERS.md`` documents) and may import
only its own layer or lower ones, except the named :data:`HANDOFFS`. Package
``__init__`` modules re-export downwards by design and are left out of the
cycle search (they are still held to the layer order).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "jointlab"
CORE = ("jointlab.analysis", "jointlab.passes", "jointlab.trace", "jointlab.io",
        "jointlab.runtime")
RENDERERS = ("jointlab.viz", "jointlab.widgets")

#: The layers, lowest level first. A module may import its own layer and the layers of
#: lower levels; layers on one level are siblings that never import each other (the
#: tracer, the readers and io each stand on the runtime alone). A name is a module or a
#: package (all of its modules). DEVELOPERS.md documents the same order.
LEVELS: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = (
    (("base", ("jointlab.errors", "jointlab.units", "jointlab.sources", "jointlab._deprecation",
               "jointlab._lazy", "jointlab.models", "jointlab.patching")),),
    (("torch_compat/meta", ("jointlab.torch_compat", "jointlab.meta")),),
    (("core", ("jointlab.core", "jointlab.inputs", "jointlab.assumptions", "jointlab.shape_guards",
               "jointlab.display", "jointlab.global_state", "jointlab.guard_values",
               "jointlab.guard_text", "jointlab.live_state", "jointlab.facts",
               "jointlab.input_grads")),),
    (("passes", ("jointlab.passes",)),),
    (("runtime", ("jointlab.runtime",)),),
    (("trace", ("jointlab.trace",)), ("analysis", ("jointlab.analysis",)),
     ("io", ("jointlab.io",))),
    (("plugins", ("jointlab.plugins",)),),
    (("viz", ("jointlab.viz",)),),
    (("widgets", ("jointlab.widgets",)),),
    (("api", ("jointlab", "jointlab.graph", "jointlab.tracing", "jointlab.reporting",
              "jointlab.renderers",
              "jointlab.cli", "jointlab.__main__")),),
)
#: ``(layer name, level, module names)`` for every layer.
LAYERS = tuple((name, level, names) for level, layers in enumerate(LEVELS)
               for name, names in layers)

#: The only upward imports allowed: one lazy hand-off each, inside the named function.
#: (importer, imported module, function holding the import)
HANDOFFS: set[tuple[str, str, str]] = set()
#: None: results ask jointlab.display for a rendering by kind; jointlab.renderers (api
#: layer) registers the renderers, so no data class imports viz/ or widgets/.
MAX_HANDOFFS = 0


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODS = _modules()


def _targets(cur: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The jointlab modules an import statement loads (``from a import b`` may name a module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            pkg = cur if MODS[cur].name == "__init__.py" else cur.rsplit(".", 1)[0]
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        subs = [f"{name}.{a.name}" for a in node.names]
        # ``from pkg import mod`` loads mod (pkg is already loaded above it); ``from pkg
        # import name`` reads pkg's own namespace, an import of pkg
        names = subs + ([name] if any(s not in MODS for s in subs) else [])
    return [n for n in names if n in MODS and n != cur]


def _edges() -> dict[str, dict[str, set[str]]]:
    """``{importer: {imported: {enclosing functions, or "<module>"}}}`` over all of jointlab."""
    edges: dict[str, dict[str, set[str]]] = {m: {} for m in MODS}
    for mod, path in MODS.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func, node in _walk(tree, "<module>"):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(mod, node):
                    edges[mod].setdefault(t, set()).add(func)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in MODS and node.value != mod
                  and node.value.startswith("jointlab.")):  # lazy-name tables
                edges[mod].setdefault(node.value, set()).add(func)
    return edges


def _walk(node: ast.AST, func: str):
    """Every descendant with the name of the innermost enclosing function."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
        yield inner, child
        yield from _walk(child, inner)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _describe(comp: list[str], edges: dict[str, dict[str, set[str]]]) -> str:
    """A component and every import inside it, with the function that holds it."""
    lines = [f"  cycle of {len(comp)}: {' <-> '.join(comp)}"]
    lines += [f"    {m} -> {t} (in {', '.join(sorted(edges[m][t]))})"
              for m in comp for t in sorted(edges[m]) if t in comp]
    return "\n".join(lines)


def test_the_import_graph_is_read_from_source():
    # guards against a walker that silently finds nothing
    edges = _edges()
    assert len(MODS) > 30 and sum(map(len, edges.values())) > 50
    assert "jointlab.tracing" in edges["jointlab"]  # jl.trace
    assert "jointlab.trace.tracer" in edges["jointlab.tracing"]
    assert "<module>" in edges["jointlab.trace.tracer"]["jointlab.trace.python_state"]
    assert "_card" in edges["jointlab.renderers"]["jointlab.viz.cards"]  # function-local


def layer_of(mod: str) -> tuple[str, int]:
    """The layer holding ``mod`` (longest name wins): its name and level."""
    best, found = "", ("", -1)
    for name, level, names in LAYERS:
        for prefix in names:
            if (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > len(best):
                best, found = prefix, (name, level)
    assert found[1] >= 0, f"{mod} is in no layer of LEVELS: add it to the right one"
    return found


def points_down(mod: str, target: str) -> bool:
    """True when ``mod`` may import ``target``: same layer, or a lower level."""
    (layer, level), (t_layer, t_level) = layer_of(mod), layer_of(target)
    return layer == t_layer or t_level < level


def upward_imports(edges: dict[str, dict[str, set[str]]]) -> list[str]:
    """``importer (layer) -> imported (layer) in function`` for each import against the order."""
    found = []
    for mod, targets in sorted(edges.items()):
        for target, funcs in sorted(targets.items()):
            if points_down(mod, target):
                continue
            for func in sorted(funcs):
                if (mod, target, func) not in HANDOFFS:
                    found.append(f"  {mod} ({layer_of(mod)[0]}) -> {target} "
                                 f"({layer_of(target)[0]}) in {func}")
    return found


def test_every_module_is_in_a_layer():
    for mod in MODS:
        layer_of(mod)


def test_imports_point_down_the_layers():
    """Every import, function-local and TYPE_CHECKING ones included, goes to its own layer or
    a lower one; the only exceptions are the named hand-offs."""
    assert len(HANDOFFS) <= MAX_HANDOFFS
    found = upward_imports(_edges())
    order = " -> ".join("|".join(name for name, _ in layers) for layers in LEVELS)
    assert not found, (f"{len(found)} import(s) against the layer order {order}:\n"
                       + "\n".join(found))


def test_the_graph_objects_never_import_the_tracer():
    """Running or loading a graph never loads the tracer: neither graph class imports it."""
    edges = _edges()
    for mod in ("jointlab.graph", "jointlab.runtime.graph", "jointlab.io.codec",
                "jointlab.io.persist"):
        reach, todo = set(), [mod]
        while todo:  # everything it loads, transitively (package __init__s excluded)
            for t in edges[todo.pop()]:
                if t not in reach and MODS[t].name != "__init__.py":
                    reach.add(t)
                    todo.append(t)
        assert not {t for t in reach if t.startswith("jointlab.trace")}, (mod, sorted(reach))


def test_nothing_inside_the_package_imports_the_facade():
    """JointGraph (jointlab.graph) is the users' front door: no layer below the API takes it."""
    api = layer_of("jointlab.graph")
    found = sorted(f"{m} -> jointlab.graph" for m, ts in _edges().items()
                   if "jointlab.graph" in ts and layer_of(m) != api)
    assert not found, found


def test_no_import_cycles():
    edges = _edges()
    inits = {m for m, p in MODS.items() if p.name == "__init__.py"}
    graph = {m: {t for t in ts if t not in inits} for m, ts in edges.items() if m not in inits}
    cycles = _cycles(graph)
    detail = "\n".join(_describe(c, edges) for c in cycles)
    assert not cycles, f"{len(cycles)} import cycle(s), function-local imports counted:\n{detail}"


def test_core_never_imports_a_renderer_except_the_handoffs():
    assert len(HANDOFFS) <= MAX_HANDOFFS
    found = {(m, t, func) for m, ts in _edges().items() if m.startswith(CORE)
             for t, funcs in ts.items() if t.startswith(RENDERERS) for func in funcs}
    extra = sorted(found - HANDOFFS)
    assert not extra, "core -> renderer imports outside the allowed hand-offs:\n" + "\n".join(
        f"  {m} -> {t} (in {func})" for m, t, func in extra)
    handoff_funcs = {func for _, _, func in HANDOFFS}
    assert handoff_funcs <= {"_repr_html_", "rich_html", "widget"}, handoff_funcs


def test_import_jointlab_loads_neither_plotly_nor_ipywidgets():
    code = ("import sys, jointlab; "
            "print(sorted(m for m in ('plotly', 'ipywidgets') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"import jointlab loads {r.stdout.strip()}"


_MUTATORS = ("setdefault", "update", "pop", "popitem", "clear", "append", "extend", "insert",
             "remove", "add", "discard")


def _is_meta(expr: ast.AST) -> bool:
    """``x.meta``, or an item of it at any depth (``x.meta[k]``, ``x.meta[k][j]``)."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    return isinstance(expr, ast.Attribute) and expr.attr == "meta"


def _is_meta_target(target: ast.AST) -> bool:
    """An assignment target that writes meta: ``x.meta = v`` or ``x.meta[k]... = v``."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_is_meta_target(e) for e in target.elts)
    if isinstance(target, ast.Starred):
        return _is_meta_target(target.value)
    return _is_meta(target)


def _meta_writes(tree: ast.AST) -> list[int]:
    """Lines that write a node's meta.

    ``x.meta = v``, ``x.meta[k] = v`` (at any depth, augmented and ``del`` too),
    ``setattr(x, "meta", v)``, and mutating calls on ``x.meta`` or an item of it
    (``x.meta.update(...)``, ``x.meta["jointlab"].setdefault(...)``).
    """
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                       else [node.target])
            lines += [node.lineno for t in targets if _is_meta_target(t)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _MUTATORS and _is_meta(node.func.value):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "meta"):
            lines.append(node.lineno)
    return lines


#: Modules that build graphs of their own and set the meta of *those* nodes only.
GRAPH_BUILDERS = {
    "jointlab.io.persist": "decodes an archive into a new graph and restores its saved meta",
    "jointlab.io.fakes": "rebuilds the fake values of a graph it is decoding",
    "jointlab.analysis.memory.whatif": "tags its private copies for torch's partitioners",
    "jointlab.analysis.bisect": "gives a region graph's placeholders a copy of their source "
                                "meta (Inductor compiles the region from meta['val'])",
    "jointlab.torch_compat.inductor": "adds provenance to Inductor's post-grad nodes",
}


def test_only_passes_write_node_meta():
    """Passes are the only writers of ``node.meta``; the tracer may set torch's own keys.

    The tracer builds the graph, so it may set torch-level keys while doing so
    (``stack_trace``, ``nn_module_stack``, the checkpoint recompute tag); no
    reader (analysis, io, viz, widgets, the graph object) writes meta at all.
    """
    found = []
    for mod, path in _modules().items():
        if mod.startswith(("jointlab.passes", "jointlab.trace")) or mod in GRAPH_BUILDERS:
            continue
        found += [f"{mod}:{line}" for line in _meta_writes(ast.parse(path.read_text()))]
    assert not found, f"node.meta written outside jointlab/passes: {found}"
    # the tracer writes no jointlab annotation itself: those come from passes
    for mod, path in _modules().items():
        if mod.startswith("jointlab.trace"):
            text = path.read_text()
            assert "setdefault(KEY" not in text and "meta[KEY]" not in text, mod
