"""No gguf2ov module imports another that (directly or not) imports it back, lazily or not, and no
stage imports another stage: only the job layer (job, run, the command line) composes stages."""

from module_graph import imports, layers, module_graph, stage_imports, topological_order, wing_graph


def test_the_package_has_no_import_cycle():
    graph = module_graph()
    assert len(graph) > 40 and "maps.load" in graph["stages.convert"] or "maps.load" in graph["job"]
    assert "errors" in graph["stages.verify"] and "gguf.quants" in graph["gguf.read"]  # the graph was read
    order = topological_order(graph)  # raises, naming the cycle, if there is one
    for module, deps in graph.items():
        assert all(order.index(d) < order.index(module) for d in deps)


def test_no_stage_imports_another_stage():
    graph = module_graph()
    assert {m for m in graph if m.startswith("stages.")} >= {"stages.export", "stages.verify", "stages.drift"}
    assert stage_imports(graph) == []
    assert any(d.startswith("stages.") for d in graph["run"])  # the job layer does compose them


def test_the_folders_follow_the_datas_way():
    """Reading GGUF, maps, checkpoints, models and their weights, running them, measuring, the stages,
    the job, the command line: each folder imports only folders before it (no cycle among them)."""
    wings = wing_graph(module_graph())
    depth = layers(wings)  # raises on a cycle among the folders
    for order in (["base", "gguf", "maps", "ir", "draft", "runtime", "checks", "stages", "job", "cli"],
                  ["base", "gguf", "maps", "ir", "targets", "runtime", "checks", "stages", "job", "cli"]):
        assert [depth[w] for w in order] == sorted(depth[w] for w in order), depth
    assert wings["base"] == set() and "stages" not in wings["tools"]


def test_the_draft_and_the_target_stand_apart():
    """The two wings share the weights below them (`ir/`) and nothing else: building a Llama target
    needs nothing of the DFlash draft, and the draft nothing of the target builder."""
    wings = wing_graph(module_graph())
    assert "ir" in wings["draft"] and "ir" in wings["targets"]
    assert "draft" not in wings["targets"] and "targets" not in wings["draft"]


def test_lazy_relative_and_absolute_imports_count(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from .b import x\n    import gguf2ov.c\n")
    (tmp_path / "b.py").write_text("from gguf2ov.a import y\nfrom . import c\n")
    (tmp_path / "c.py").write_text("import os\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "d.py").write_text("from ..c import z\nfrom . import e\n")
    (tmp_path / "pkg" / "e.py").write_text("def g():\n    from ..a import f\n")
    graph = module_graph(tmp_path)
    assert graph["a"] == {"b", "c"} and graph["b"] == {"a", "c"} and graph["c"] == set()
    assert graph["pkg.d"] == {"c", "pkg.e"} and graph["pkg.e"] == {"a"}
    try:
        topological_order(graph)
    except ValueError as e:
        assert "a -> b -> a" in str(e)
    else:
        raise AssertionError("the cycle a <-> b was not found")
    assert imports(tmp_path / "a.py", set(graph), tmp_path) == {"b", "c"}
    del graph["b"], graph["a"]
    graph["pkg.e"] = set()
    assert layers(graph) == {"c": 1, "pkg": 1, "pkg.e": 1, "pkg.d": 2}
