"""The package is a one-way pipeline: no import cycles, no core -> renderer imports.

The import graph is read from the source with ``ast``, so it counts what a
runtime check would miss: function-local imports, ``TYPE_CHECKING`` imports
and module names written as strings in the package's lazy tables (the same
rules as ``../shared/tools/import_cycles.py``). Package ``__init__`` modules
re-export downwards by design and are left out of the cycle search.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "jointlab"
CORE = ("jointlab.analysis", "jointlab.passes", "jointlab.trace", "jointlab.io")
RENDERERS = ("jointlab.viz", "jointlab.widgets")

#: The only core -> renderer imports allowed: one lazy hand-off each, inside the named
#: function. (importer, imported renderer module, function holding the import)
HANDOFFS: set[tuple[str, str, str]] = {
    # Stepper.widget() builds the stepper panel: the one documented widget hand-off
    ("jointlab.analysis.step.stepper", "jointlab.widgets._stepper", "widget"),
    # HumanFrame._repr_html_: joint.nodes and the summaries shown in human units, unwrapped
    ("jointlab.analysis.tables", "jointlab.viz.tables", "_repr_html_"),
}
MAX_HANDOFFS = 3


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
        names = [name] + [f"{name}.{a.name}" for a in node.names]
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
    assert "jointlab.trace.tracer" in edges["jointlab"]  # jl.trace
    assert "<module>" in edges["jointlab.trace.tracer"]["jointlab.trace.python_state"]


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
    assert handoff_funcs <= {"_repr_html_", "widget"}, handoff_funcs


def test_import_jointlab_loads_neither_plotly_nor_ipywidgets():
    code = ("import sys, jointlab; "
            "print(sorted(m for m in ('plotly', 'ipywidgets') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"import jointlab loads {r.stdout.strip()}"


def _meta_writes(tree: ast.AST) -> list[int]:
    """Lines that write into a node's meta: ``x.meta[k] = v`` or ``x.meta.setdefault/update``."""

    def is_meta(expr: ast.AST) -> bool:
        return isinstance(expr, ast.Attribute) and expr.attr == "meta"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for t in targets
                      if isinstance(t, ast.Subscript) and is_meta(t.value)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("setdefault", "update", "pop", "clear") \
                and is_meta(node.func.value):
            lines.append(node.lineno)
    return lines


#: Modules that build graphs of their own and set the meta of *those* nodes only.
GRAPH_BUILDERS = {
    "jointlab.io.persist": "decodes an archive into a new graph and restores its saved meta",
    "jointlab.io.fakes": "rebuilds the fake values of a graph it is decoding",
    "jointlab.analysis.memory.whatif": "tags its private copies for torch's partitioners",
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
