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
from gguf2ov.numerics import (DQ_KEY, EXACT, F32_HINT, compile_exact, core, describe_numerics, numerics,
                              rounds_unlike_exact)

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


def test_numerics_name_the_cpu_the_group_size_and_the_kv_cache_in_force():
    runtime = numerics("CPU", F32_HINT)
    assert runtime["device_name"] and runtime["inference_precision"] == "f32"
    assert runtime["dynamic_quantization_group_size"] == runtime["dynamic_quantization_default"]
    assert runtime["kv_cache_precision"] == runtime["kv_cache_precision_default"] in ("u8", "f16", "bf16", "f32")
    exact = numerics("CPU", EXACT)
    assert exact["dynamic_quantization_group_size"] == 0 and exact["activations"] == "float"
    assert exact["kv_cache_precision"] == "f32" and describe_numerics(exact).endswith("KV cache f32")


def test_only_arithmetic_that_differs_from_the_exact_mode_asks_for_a_recheck():
    """The acceptance recheck runs where the plugin's own arithmetic can part texts, and never with
    the CPU plugin's keys on a device that reports none of them."""
    assert not rounds_unlike_exact(numerics("CPU", EXACT))
    assert rounds_unlike_exact({"dynamic_quantization_group_size": 32, "kv_cache_precision": "f32"})
    assert rounds_unlike_exact({"dynamic_quantization_group_size": 0, "kv_cache_precision": "u8"})
    assert not rounds_unlike_exact({"dynamic_quantization_group_size": None, "kv_cache_precision": None})  # a GPU
    runtime = numerics("CPU", F32_HINT)
    assert rounds_unlike_exact(runtime) == bool(runtime["dynamic_quantization_group_size"]
                                                or runtime["kv_cache_precision"] != "f32")



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
    assert numerics("CPU", {}, options)["dynamic_quantization_group_size"] == 16
    assert numerics("CPU", {DQ_KEY: 0}, options)["dynamic_quantization_group_size"] == 0
    assert model_runtime_options(tmp_path / "absent.xml") == {}
