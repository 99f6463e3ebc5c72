"""Fail when dask_ddp's modules import each other in a cycle (``make lint``).

Every import counts: at module level, inside a function, and under ``TYPE_CHECKING`` (the
lazy facades list their API there; mypy follows them). import-linter's contracts check the
layers and siblings of one package; this checks the whole graph of the package's modules.

The graph is grimp's (``include_external_packages=False``), with one kind of edge left out:

- **``from <package> import <compiled module>``** (``from dask_ddp import _core``): grimp
  reads ``.py`` files only, so it records the import of the compiled engine as an import of
  the package itself, i.e. of its ``__init__`` (a lazy facade whose ``TYPE_CHECKING`` block
  imports most of the package). The compiled module imports no Python module of the
  package: the edge really ends at a leaf. Left out only when every name the line imports
  from the package is such a module (a ``.pyi`` stub or an extension file beside the
  ``__init__``) or a Python submodule (grimp records those as edges of their own).

A package's ``__init__`` importing its own modules (the facades' ``TYPE_CHECKING`` blocks)
is kept: it closes a cycle only with an import back into the package's ``__init__`` from
inside it (``import dask_ddp`` in a module of dask_ddp), and that cycle is reported.

Prints each cycle (its modules, and the import lines that make it) and exits 1; exits 0
when there is none.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import grimp

PACKAGE = "dask_ddp"


def _compiled_modules(graph: grimp.ImportGraph, package: str) -> set[str]:
    """The names of the compiled modules beside ``package``'s ``__init__`` (``_core``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return set()
    root = Path(list(spec.submodule_search_locations)[0])
    suffixes = [".pyi", *importlib.machinery.EXTENSION_SUFFIXES]
    names = set()
    for path in root.iterdir():
        for suffix in suffixes:
            if path.name.endswith(suffix):
                names.add(path.name[: -len(suffix)])
    return {n for n in names if f"{package}.{n}" not in graph.modules}


def _imported_names(line: str) -> list[str] | None:
    """The names of a ``from X import a, b`` line; ``None`` for any other line."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.ImportFrom):
        return None
    return [alias.name for alias in node.names]


def _to_leaf(graph: grimp.ImportGraph, importer: str, package: str,
             compiled: dict[str, set[str]]) -> bool:
    """Whether every import of ``package`` by ``importer`` names only compiled modules
    (or submodules) of it: the edge grimp drew to the package's ``__init__`` is not one."""
    details = graph.get_import_details(importer=importer, imported=package)
    if not details:
        return False
    for detail in details:
        names = _imported_names(detail["line_contents"])
        if names is None:
            return False
        for name in names:
            if name not in compiled[package] and f"{package}.{name}" not in graph.modules:
                return False
    return True


def import_graph(graph: grimp.ImportGraph, package: str) -> dict[str, set[str]]:
    """``{module: modules it imports}`` among ``package``'s modules, with the edges to
    compiled modules left out (see the module's docstring)."""
    packages = {m for m in graph.modules if graph.find_children(m)}
    compiled = {p: _compiled_modules(graph, p) if p == package else set() for p in packages}
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        edges[module] = {
            target for target in graph.find_modules_directly_imported_by(module)
            if not (target in packages and compiled[target]
                    and _to_leaf(graph, module, target, compiled))}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative); a
    module importing itself (a function reading its own module's globals) is none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def main() -> int:
    # No cache: the graph of the tree as it is now (as lint-imports --no-cache).
    graph = grimp.build_graph(PACKAGE, include_external_packages=False,
                              exclude_type_checking_imports=False, cache_dir=None)
    edges = import_graph(graph, PACKAGE)
    found = cycles(edges)
    for n, component in enumerate(found, 1):
        _say(f"import cycle {n}: {len(component)} modules of {PACKAGE}")
        members = set(component)
        for module in component:
            for target in sorted(edges[module] & members):
                for detail in graph.get_import_details(importer=module, imported=target):
                    _say(f"  {module}:{detail['line_number']} -> {target}: "
                         f"{detail['line_contents'].strip()}")
    if found:
        _say(f"{len(found)} import cycle(s) among {PACKAGE}'s modules (function-level and "
             "TYPE_CHECKING imports counted): break them (a leaf module, or pass the "
             "value in)")
        return 1
    _say(f"no import cycle among {PACKAGE}'s {len(edges)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
