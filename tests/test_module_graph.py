"""No gguf2ov module imports another that (directly or not) imports it back, lazily or not."""

from module_graph import imports, module_graph, topological_order


def test_the_package_has_no_import_cycle():
    graph = module_graph()
    assert len(graph) > 20 and "maps" in graph["convert"]  # the graph was read, not empty
    order = topological_order(graph)  # raises, naming the cycle, if there is one
    for module, deps in graph.items():
        assert all(order.index(d) < order.index(module) for d in deps)


def test_lazy_and_absolute_imports_count(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from .b import x\n    import gguf2ov.c\n")
    (tmp_path / "b.py").write_text("from gguf2ov.a import y\nfrom . import c\n")
    (tmp_path / "c.py").write_text("import os\n")
    graph = module_graph(tmp_path)
    assert graph == {"a": {"b", "c"}, "b": {"a", "c"}, "c": set()}
    try:
        topological_order(graph)
    except ValueError as e:
        assert "a -> b -> a" in str(e)
    else:
        raise AssertionError("the cycle a <-> b was not found")
    assert imports(tmp_path / "a.py", {"a", "b", "c"}) == {"b", "c"}
