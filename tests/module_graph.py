"""The import graph of the gguf2ov package, read from its source with `ast` (nothing is imported).

Modules are named by their dotted path inside the package (`stages.verify`, `errors`). Every
`from .x import`, `from ..x.y import`, `from . import x`, `from gguf2ov.x import` and
`import gguf2ov.x` counts, at the top of a module or inside a function: a lazy import is still a
dependency. A package's `__init__` counts as the package itself.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gguf2ov"
STAGES = "stages"  # the wing whose modules may not import one another: only the job layer composes them


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["__init__"]
    return ".".join(parts)


def _resolve(base: list[str], names: list[str], modules: set[str]) -> set[str]:
    """The modules `from <base> import <names>` reaches: the module `base`, or `base.name` for each
    name that is a module of its own."""
    found = set()
    for name in names:
        dotted = ".".join([*base, name])
        if dotted in modules:
            found.add(dotted)
        elif base:
            found.add(".".join(base))
    return found


def imports(path: Path, modules: set[str], package: Path = PACKAGE) -> set[str]:
    """The package modules that the module at `path` imports."""
    me = module_name(path, package)
    here = me.split(".")[:-1] if path.name != "__init__.py" else me.split(".")
    if me == "__init__":
        here = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else list(here)
                if node.level - 1 > len(here):
                    continue
            elif module.split(".")[0] == "gguf2ov":
                base = []
                module = ".".join(module.split(".")[1:])
            else:
                continue
            base = base + (module.split(".") if module else [])
            found |= _resolve(base, [a.name for a in node.names], modules)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gguf2ov."):
                    dotted = a.name[len("gguf2ov."):]
                    found.add(dotted if dotted in modules else dotted.rsplit(".", 1)[0])
    return {m for m in found if m in modules and m != me}


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the modules it imports} for every module of the package."""
    files = sorted(package.rglob("*.py"))
    modules = {module_name(p, package) for p in files}
    return {module_name(p, package): imports(p, modules, package) for p in files}


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


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's layer: 1 + the longest chain of imports below it (a module importing nothing: 1)."""
    depth: dict[str, int] = {}
    for module in topological_order(graph):
        depth[module] = 1 + max((depth[d] for d in graph[module]), default=0)
    return depth


WINGS = ("gguf", "maps", "hf", "ir", "draft", "targets", "runtime", "checks", "stages", "cli", "tools")
JOB = ("job", "run", "sources")


def wing(module: str) -> str:
    """The folder a module lives in along the data's way (`base`: the shared top-level modules)."""
    head = module.split(".")[0]
    if head in WINGS:
        return head
    if module == "__main__":
        return "cli"
    return "job" if module in JOB else "base"


def wing_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """{wing: the wings its modules import}."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        out.setdefault(wing(module), set()).update(wing(d) for d in deps if wing(d) != wing(module))
    return out


def stage_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(stage, stage it imports) pairs: a stage that composes another instead of the job doing it."""
    def is_stage(m):
        return m.startswith(STAGES + ".")

    return sorted((m, d) for m, deps in graph.items() if is_stage(m) for d in deps if is_stage(d))
