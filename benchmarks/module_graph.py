"""Print gguf2ov's import graph in topological order (dependencies first), for developer notes.

    python benchmarks/module_graph.py

Each line is a module and the package modules it imports (at the top or inside a function). The
same graph is asserted acyclic by tests/test_module_graph.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from module_graph import module_graph, topological_order  # noqa: E402


def main() -> int:
    graph = module_graph()
    for module in topological_order(graph):
        deps = ", ".join(sorted(graph[module]))
        print(f"{module:14} <- {deps}" if deps else module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
