"""No import cycles between minisgl's modules.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``: a cycle that
only type hints close still couples two modules both ways, and a lazy import inside a function is
how such cycles used to hide. The graph is read from the source (``ast``), so the test imports
nothing and runs anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

PYTHON = Path(__file__).resolve().parents[2] / "python"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``)."""
    found = {}
    for path in (PYTHON / "minisgl").rglob("*.py"):
        parts = list(path.relative_to(PYTHON).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the minisgl modules it imports (``from pkg import mod`` names the submodule)."""
    modules = _modules()
    graph = {}
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        deps.add(sub)
                    elif target in modules:
                        deps.add(target)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_minisgl_has_no_import_cycles() -> None:
    graph = import_graph()
    assert "minisgl.sampling.sampler" in graph and "minisgl.core" in graph
    found = cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "".join(f"\n    {m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in found)
    assert not found, f"import cycles:\n{detail}"


# The front end's layers, lowest first (docs/architecture.md): a module may import its own layer
# and those before it. Every package not named here is the engine (core, kvcache, layers, models,
# scheduler, ...) and comes first; it is one layer, whose packages are not ordered among themselves.
LAYERS = ("minisgl.tokenizer", "minisgl.llm", "minisgl", "minisgl.server",
          "minisgl.server.openai", "minisgl.server.agents", "minisgl.server.app",
          "minisgl.server.launch", "minisgl.__main__")


def layer(module: str) -> int:
    """The index of the deepest layer that holds ``module`` (0: the engine)."""
    found = [i for i, name in enumerate(LAYERS)
             if module == name or (name != "minisgl" and module.startswith(name + "."))]
    return max(found, default=-1) + 1


def test_the_layer_order_places_packages():
    assert layer("minisgl.scheduler.prefill") == 0 and layer("minisgl") == 3
    assert layer("minisgl.server.config") == 4 and layer("minisgl.server.openai.chat") == 5
    assert layer("minisgl.server.launch.serve") == 8 and layer("minisgl.tokenizer.server") == 1


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    upward = sorted(f"{m} ({LAYERS[layer(m) - 1] if layer(m) else 'engine'}) imports {d} "
                    f"({LAYERS[layer(d) - 1]})"
                    for m, deps in graph.items() for d in deps if layer(d) > layer(m))
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)
