"""Exactness checks stay exact on every CPU: with the CPU plugin's dynamic quantization of
activations requested, the exact mode still computes in float32, and GGUF exports whose types the
plugin runs on int8 activations (Q8_0, Q5_0) still verify against their source."""

import json

import numpy as np
import pytest
from openvino import opset13 as ops

from gguf2ov import cli
from gguf2ov.gguf import quants
from gguf2ov.gguf.quants import QType as Q
from gguf2ov.gguf.transcode import grid_weight
from gguf2ov.numerics import (DQ_KEY, EXACT, F32_HINT, KV_KEY, compile_exact, core, describe_numerics,
                              rounds_unlike_exact)
from gguf2ov.runtime.arithmetic import MOVED, measured_numerics

REPO_FIXTURES = cli.__file__.rsplit("/gguf2ov/", 1)[0] + "/fixtures"


@pytest.fixture
def dynamic_quantization_requested():
    """The process's core asks the plugin to quantize activations in groups of 32, as its default
    does on VNNI/AMX CPUs; a CPU that cannot still runs the exact path below."""
    c = core()
    before = c.get_property("CPU", DQ_KEY)
    c.set_property("CPU", {DQ_KEY: 32})
    yield
    c.set_property("CPU", {DQ_KEY: before})


def grid_model(qtype, rows: int = 48, width: int = 512):
    import openvino as ov

    rng = np.random.default_rng(7)
    w = rng.standard_normal((rows, width)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    x = ops.parameter([-1, -1, width], np.float32)
    model = ov.Model([ops.result(ops.matmul(x, grid_weight(raw, qtype, w.shape), False, True))], [x])
    return model, quants.dequantize(raw, qtype).reshape(w.shape)


def relative_error(compiled, reference_weight) -> float:
    x = np.random.default_rng(1).standard_normal((2, 3, reference_weight.shape[1])).astype(np.float32)
    want = x @ reference_weight.T
    return float(np.linalg.norm(compiled(x)[0] - want) / np.linalg.norm(want))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_the_exact_mode_stays_exact_with_dynamic_quantization_requested(dynamic_quantization_requested, qtype):
    model, reference = grid_model(qtype)
    compiled = compile_exact(model)
    assert compiled.get_property(DQ_KEY) == 0
    assert relative_error(compiled, reference) < 1e-5


def test_the_plugin_quantizes_activations_where_asked(dynamic_quantization_requested):
    """The control: the same Q8_0 weight compiled the way a user's pipeline is (f32 hint only) runs
    with int8 activations, so the exact mode above is tested against a real effect."""
    model, reference = grid_model(Q.Q8_0)
    error = relative_error(core().compile_model(model, "CPU", F32_HINT), reference)
    if error < 1e-5:
        pytest.skip(f"this CPU's plugin does not quantize activations even when asked ({error:.1e})")
    assert error > 1e-4


@pytest.fixture(scope="module")
def q8_0_draft(tmp_path_factory, fixtures_dir):
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    path = tmp_path_factory.mktemp("q8") / "draft-Q8_0.gguf"
    write_dflash_gguf(fixtures_dir / "draft-ref", path, fixtures_dir / "target-hf", mix="Q8_0")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("which", ["vlm Q4_K_M (Q5_0, Q4_K)", "Q8_0"])
def test_gguf_exports_verify_with_dynamic_quantization_requested(dynamic_quantization_requested, which, q8_0_draft,
                                                                 tmp_path):
    source = q8_0_draft if which == "Q8_0" else f"{REPO_FIXTURES}/tiny-vlm/draft-Q4_K_M.gguf"
    report = tmp_path / "export.json"
    code = cli.main(["export", str(source), "-o", str(tmp_path / "draft"), "--weight-format", "gguf",
                     "--json", str(report), "--quiet"])
    result = json.loads(report.read_text())
    match = next(c for c in result["verify"]["checks"] if c["name"] == "checkpoint-match")
    assert code == 0 and match["status"] == "pass", match
    assert result["verify"]["figures"]["max_abs_diff"] < 1e-5 * result["verify"]["figures"]["reference_max_abs"]


def _saved(tmp_path, name, weights) -> str:
    """A chain of MatMuls over `weights` (output subgraphs [width, width]), saved as an IR."""
    import openvino as ov

    x = ops.parameter([-1, -1, 512], np.float32, name="x")
    y = x
    for w in weights:
        y = ops.matmul(y, w, False, True)
    ov.save_model(ov.Model([ops.result(y)], [x]), str(tmp_path / f"{name}.xml"), compress_to_fp16=False)
    return str(tmp_path / f"{name}.xml")


def _grid(qtype, seed: int, **form):
    w = np.random.default_rng(seed).standard_normal((512, 512)).astype(np.float32) / 20
    return grid_weight(quants.quantize(w, qtype), qtype, w.shape, **form)


def _moved(xml) -> float:
    """How far the whole model's output moves when the plugin's dynamic quantization is switched off."""
    x = np.random.default_rng(3).standard_normal((1, 8, 512)).astype(np.float32)
    a = core().compile_model(xml, "CPU", F32_HINT)(x)[0]
    b = core().compile_model(xml, "CPU", {**F32_HINT, DQ_KEY: 0})(x)[0]
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_stated_arithmetic_is_what_the_compiled_model_runs(tmp_path):
    """What a report states, per weight form, is held against the whole model compiled as a pipeline compiles
    it: one FullyConnected per MatMul stated, in the stated codes' precision, the KV cache and the inference
    precision it reports; and its output moves with dynamic quantization switched off exactly when a form is
    stated int8. On every CPU: a Q8_0 weight takes the int8 path on VNNI and AMX CPUs and none on AVX2-only
    ones; a Q4_K weight folded with its f32 zero point never does."""
    plain = ops.constant(np.random.default_rng(4).standard_normal((512, 512)).astype(np.float32) / 20).output(0)
    mixed = _saved(tmp_path, "mixed", [_grid(Q.Q8_0, 1), _grid(Q.Q4_K, 2, folded=True), plain])
    folded = _saved(tmp_path, "folded", [_grid(Q.Q4_K, 5, folded=True), _grid(Q.Q6_K, 6, folded=True)])
    info = measured_numerics({"target": mixed, "draft": folded}, "CPU", F32_HINT)
    stated = {role: [f for f in forms] for role, forms in info["models"].items()}
    assert [f["matmuls"] for f in stated["target"]] == [1, 1, 1] and sum(f["matmuls"] for f in stated["draft"]) == 2
    compiled = core().compile_model(mixed, "CPU", F32_HINT)
    precisions = sorted(op.get_rt_info()["runtimePrecision"].astype(str)
                        for op in compiled.get_runtime_model().get_ordered_ops()
                        if op.get_rt_info()["layerType"].astype(str) == "FullyConnected")
    assert precisions == sorted(f["form"].split(",")[0] for f in stated["target"])
    assert info["kv_cache_precision"] == compiled.get_property(KV_KEY).get_type_name()
    assert info["inference_precision"] == compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
    q8 = next(f for f in stated["target"] if f["form"].startswith("i8"))
    assert not any(f["int8"] for f in stated["target"] if f is not q8) and not any(f["int8"] for f in stated["draft"])
    assert (_moved(mixed) > MOVED) == q8["int8"] == (info["int8_matmuls"] == 1)
    assert _moved(folded) == 0.0
    phrase = describe_numerics(info)
    assert phrase.startswith(info["device_name"]) and phrase.endswith(f"KV cache {info['kv_cache_precision']}")
    assert (f"int8 activations in 1 of 3 target MatMuls and 0 of 2 draft MatMuls" in phrase if q8["int8"] else
            "float activations in every MatMul (3 target, 2 draft)" in phrase)


def test_the_exact_mode_is_stated_float_everywhere(tmp_path):
    xml = _saved(tmp_path, "q8", [_grid(Q.Q8_0, 1)])
    info = measured_numerics({"draft": xml}, "CPU", EXACT)
    assert info["int8_matmuls"] == 0 and info["dynamic_quantization_group_size"] == 0
    assert info["kv_cache_precision"] == "f32" and not rounds_unlike_exact(info)
    assert describe_numerics(info).endswith("float activations in every MatMul (1 draft), KV cache f32")


def test_only_arithmetic_that_differs_from_the_exact_mode_asks_for_a_recheck():
    """The acceptance recheck runs where the plugin's own arithmetic can part texts, and never with
    the CPU plugin's keys on a device that reports none of them."""
    assert rounds_unlike_exact({"int8_matmuls": 3, "kv_cache_precision": "f32"})
    assert rounds_unlike_exact({"int8_matmuls": 0, "kv_cache_precision": "u8"})
    assert not rounds_unlike_exact({"int8_matmuls": 0, "kv_cache_precision": "f32"})
    assert not rounds_unlike_exact({"int8_matmuls": 0, "kv_cache_precision": None})  # a GPU


@pytest.mark.slow
def test_verify_against_the_original_of_a_gguf_says_which_source_the_ir_came_from(tmp_path):
    """The BF16 original of a Q4_K_M draft differs from the GGUF's function by the quantization
    error: verify says the sources differ and points at `check`, not at random weights."""
    fixture = f"{REPO_FIXTURES}/tiny-dflash2"
    draft = tmp_path / "draft"
    assert cli.main(["export", f"{fixture}/draft-Q4_K_M.gguf", "-o", str(draft), "--weight-format", "gguf",
                     "--quiet"]) == 0
    report = tmp_path / "verify.json"
    code = cli.main(["verify", str(draft), "--checkpoint", f"{fixture}/draft-ref", "--json", str(report), "--quiet"])
    match = next(c for c in json.loads(report.read_text())["checks"] if c["name"] == "checkpoint-match")
    assert code == 1 and match["status"] == "fail"
    assert "exported from" in match["reason"] and "draft-Q4_K_M.gguf" in match["reason"]
    assert "gguf2ov check" in match["reason"] and "random" not in match["reason"]
    # against the file it came from, the same IR passes
    assert cli.main(["verify", str(draft), "--checkpoint", f"{fixture}/draft-Q4_K_M.gguf", "--quiet"]) == 0


def test_a_models_own_runtime_options_are_the_numerics_in_force(tmp_path):
    """A target that carries the plugin's activation group in its rt_info (`runtime_options`, as optimum-intel
    writes some) runs with it unless a property overrides it, and the report's numerics say so."""
    import openvino as ov

    from gguf2ov.numerics import model_runtime_options

    x = ops.parameter([1, 4], np.float32, name="x")
    model = ov.Model([ops.result(ops.relu(x))], [x])
    model.set_rt_info("16", ["runtime_options", DQ_KEY])
    ov.save_model(model, str(tmp_path / "m.xml"))
    options = model_runtime_options(tmp_path / "m.xml")
    assert options == {DQ_KEY: 16}
    assert ov.Core().compile_model(str(tmp_path / "m.xml"), "CPU").get_property(DQ_KEY) == 16  # OpenVINO applies it
    assert measured_numerics({"target": tmp_path / "m.xml"}, "CPU", {})["dynamic_quantization_group_size"] == 16
    assert measured_numerics({"target": tmp_path / "m.xml"}, "CPU", {DQ_KEY: 0})["dynamic_quantization_group_size"] == 0
    assert model_runtime_options(tmp_path / "absent.xml") == {}
