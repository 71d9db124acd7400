"""Print gguf2ov's import graph in topological order (dependencies first), with each module's layer
and the depth of the whole, for developer notes.

    python -m benchmarks.module_graph

Each line is a module, its layer (1 + the longest chain of imports below it) and the package
modules it imports (at the top or inside a function). The same graph is asserted acyclic, and
free of stage-to-stage imports, by tests/test_module_graph.py.
"""

import sys

from tests.module_graph import layers, module_graph, stage_imports, topological_order


def main() -> int:
    graph = module_graph()
    depth = layers(graph)
    width = max(len(m) for m in graph)
    for module in topological_order(graph):
        deps = ", ".join(sorted(graph[module]))
        print(f"{depth[module]:2}  {module:{width}} <- {deps}" if deps else f"{depth[module]:2}  {module}")
    print(f"\n{len(graph)} modules, {sum(map(len, graph.values()))} imports, depth {max(depth.values())}; "
          f"stage-to-stage imports: {stage_imports(graph) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
