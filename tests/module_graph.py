"""The import graph of the gguf2ov package, read from its source with `ast` (nothing is imported).

Every `from .x import`, `from . import x`, `from gguf2ov.x import` and `import gguf2ov.x` counts,
at the top of a module or inside a function: a lazy import is still a dependency.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gguf2ov"


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules that the module at `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                parts = module.split(".") if module else []
            elif node.level == 0 and module.split(".")[0] == "gguf2ov":
                parts = module.split(".")[1:]
            else:
                continue
            found |= {parts[0]} if parts else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("gguf2ov.")}
    return {m for m in found if m in modules and m != path.stem}


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the modules it imports} for every module of the package."""
    files = sorted(package.glob("*.py"))
    modules = {p.stem for p in files}
    return {p.stem: imports(p, modules) for p in files}


def topological_order(graph: dict[str, set[str]]) -> list[str]:
    """Modules with every dependency before its dependents; raises ValueError naming a cycle."""
    order, state = [], {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            raise ValueError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        state[module] = "open"
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        state[module] = "done"
        order.append(module)

    for module in sorted(graph):
        visit(module, [])
    return order
