"""The project's import graph read from source with ``ast``: every ``import`` of one of our modules, at module
level or inside a function, as an edge ``(importer, imported, in_function)``. Used by tests/mixdiag/test_layers.py."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: installed package -> folder in the checkout (setup.py's MAPPED)
MAPPED = {"mixdiag": "mixdiag", "mixdiag.engine": "engine",
          "mixdiag.collectors": "collectors", "mixdiag.dashboard": "dashboard"}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    in_function: bool
    line: int

    def __str__(self) -> str:
        where = "in a function" if self.in_function else "at module level"
        return f"{self.importer} -> {self.imported} ({where}, line {self.line})"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file for every module of the four installed packages."""
    out = {}
    for pkg, folder in MAPPED.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if pkg == "mixdiag" and parts and parts[0] in ("engine", "collectors", "dashboard"):
                continue  # not in this checkout's layout; never installed under mixdiag/
            out[".".join([pkg, *parts])] = path
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module or a name inside one) lives in, or None if not ours."""
    while name:
        if name in known:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def edges_of(module: str, source: str, known: dict[str, Path], is_package: bool = False) -> list[Edge]:
    """The import edges of one module's source text."""
    tree = ast.parse(source)
    in_func: set[int] = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_func |= {id(n) for n in ast.walk(f) if n is not f}
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            for a in node.names:
                full = f"{base}.{a.name}"
                targets.append(full if full in known else base)
        for t in targets:
            owner = _owner(t, known)
            if owner and owner != module:
                out.append(Edge(module, owner, id(node) in in_func, node.lineno))
    return out


def third_party_of(source: str) -> set[str]:
    """Top-level names of every module a source imports (any depth), e.g. {'torch', 'numpy', 'mixdiag'}."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def graph(root: Path = ROOT) -> tuple[dict[str, Path], list[Edge]]:
    """All modules and all import edges of the checkout."""
    known = modules(root)
    edges = []
    for name, path in known.items():
        edges += edges_of(name, path.read_text(), known, path.name == "__init__.py")
    return known, edges


def cycles(nodes, edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        succ.setdefault(e.importer, []).append(e.imported)
        succ.setdefault(e.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    counter = 0
    for start in succ:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ[w])))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
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
                    found.append(sorted(comp))
    return found
