"""`gguf2ov target` on hostile GGUFs, from what fuzzing target GGUFs found: NaN and Inf weights are
refused in every weight format, naming the tensor (`--allow-nonfinite` writes them, with a warning);
a map op refuses a value it cannot take, with no numpy warning; the file is held to llama.cpp's rules
for its alignment and tensor layout."""

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import benchmark
from qwen35_data import LLAMACPP_FILE

from gguf2ov.cli import main
from gguf2ov.gguf.read import open_gguf

FORMATS = {"gguf": [], "compact": ["--compact-grid"], "fp16": ["--weight-format", "fp16"],
           "fp32": ["--weight-format", "fp32"], "int8": ["--weight-format", "int8"],
           "int4": ["--weight-format", "int4", "--group-size", "16"]}


def _target(capsys, *argv) -> tuple[int, str, list[str]]:
    """(exit code, stderr, numpy warnings) of `gguf2ov target ARGV --quiet`."""
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["target", *map(str, argv), "--quiet"])
    return code, capsys.readouterr().err, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _refused(capsys, *argv) -> str:
    """The one error line (and its hint) of a build that must fail, which leaves no folder and prints no
    numpy warning."""
    code, err, numpy_warnings = _target(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert not numpy_warnings
    out = argv[argv.index("-o") + 1]
    assert not out.exists() and not list(out.parent.glob(".out.partial-*"))
    return err.strip()


def _patched(src, dst, tensor: str, fmt: str, value, at: int = 0):
    """`src` with one value of `tensor`'s stored bytes (at byte `at` of its data) overwritten."""
    info = open_gguf(src).tensors[tensor]
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, info.offset + at, value)
    dst.write_bytes(bytes(data))
    return dst


# --- NaN and Inf weights ---------------------------------------------------------------------------

@pytest.mark.parametrize("weight_format", list(FORMATS))
def test_a_broken_block_scale_is_refused_in_every_weight_format(tmp_path, q4_k_m, capsys, weight_format):
    """A NaN d in one Q4_K block: the grid's scales (folded or the file's own), the dequantized values
    (fp32, fp16) and the values NNCF compresses (int8, int4) all hold it."""
    path = _patched(q4_k_m, tmp_path / "t.gguf", "blk.0.ffn_up.weight", "<e", np.nan)
    line = _refused(capsys, path, "-o", tmp_path / "out", *FORMATS[weight_format])
    what = "quantization scales" if weight_format in ("gguf", "compact") else "values"
    assert f"model.layers.0.mlp.up_proj.weight (from blk.0.ffn_up.weight, Q4_K) holds " in line
    assert f"NaN or Inf {what} of" in line and "in the file" in line and "--allow-nonfinite" in line


@pytest.mark.parametrize("weight_format, needle", [
    ("fp16", "values are too large for float16"), ("int8", "NNCF scales are too large for float16"),
    ("int4", "NNCF scales are too large for float16")])
def test_values_too_large_for_what_the_format_stores_are_refused(tmp_path, q4_k_m, capsys, weight_format, needle):
    """d = 65504 (float16's largest) in one Q4_K block: its values reach ~1e6, finite in float32 but
    beyond float16 and beyond what NNCF's float16 scales hold."""
    path = _patched(q4_k_m, tmp_path / "t.gguf", "blk.0.ffn_up.weight", "<e", 65504.0)
    line = _refused(capsys, path, "-o", tmp_path / "out", *FORMATS[weight_format])
    assert "model.layers.0.mlp.up_proj.weight (from blk.0.ffn_up.weight, Q4_K): " in line and needle in line
    code, err, numpy_warnings = _target(capsys, path, "-o", tmp_path / "fp32", "--weight-format", "fp32")
    assert code == 0 and not numpy_warnings, err  # float32 holds them


def test_allow_nonfinite_writes_the_target_and_says_so(tmp_path, q4_k_m, capsys):
    path = _patched(q4_k_m, tmp_path / "t.gguf", "blk.0.attn_norm.weight", "<f", np.inf, at=4 * 7)
    line = _refused(capsys, path, "-o", tmp_path / "out")
    assert ("model.layers.0.input_layernorm.weight (from blk.0.attn_norm.weight, F32) holds 1 NaN or Inf values of "
            "256") in line and "--allow-nonfinite" in line
    code, err, numpy_warnings = _target(capsys, path, "-o", tmp_path / "out", "--allow-nonfinite",
                                        "--json", tmp_path / "report.json")
    assert code == 0 and not numpy_warnings
    assert ("warning: model.layers.0.input_layernorm.weight was written with 1 NaN or Inf values "
            "(--allow-nonfinite)") in err  # under --quiet too
    assert json.loads((tmp_path / "report.json").read_text())["nonfinite"] == {
        "model.layers.0.input_layernorm.weight": 1}
    options = json.loads((tmp_path / "out" / "gguf2ov.json").read_text())["options"]
    assert options["allow_nonfinite"] is True and options["nonfinite"] == {"model.layers.0.input_layernorm.weight": 1}


def test_alignment_stated_as_1_over_data_laid_out_at_32_is_refused_by_its_weights(tmp_path, q4_k_m, capsys):
    """general.alignment 1 over a file laid out at 32 reads every tensor up to 31 bytes early. llama.cpp
    accepts alignment 1, and where every tensor's size is a multiple of 32 (this file's) its layout rule
    holds too: only the values tell, and they hold NaN and Inf scales."""
    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(q4_k_m.read_bytes())
    assert all(t.offset % 32 == 0 for t in model.tensors)
    assert all(open_gguf(q4_k_m).tensors[t.name].n_bytes % 32 == 0 for t in model.tensors)
    model.kv.insert(0, ["general.alignment", fuzz.T_U32, 32])
    data, fields = fuzz.serialise(model)  # laid out at 32
    (tmp_path / "at32.gguf").write_bytes(data)
    stated = next(f for f in fields if f.label == "general.alignment")
    data = bytearray(data)
    struct.pack_into("<I", data, stated.pos, 1)
    path = tmp_path / "t.gguf"
    path.write_bytes(bytes(data))
    read_at = {p: open_gguf(p).tensors["token_embd.weight"].offset for p in (path, tmp_path / "at32.gguf")}
    assert read_at[path] < read_at[tmp_path / "at32.gguf"]  # read early
    line = _refused(capsys, path, "-o", tmp_path / "out")
    assert "NaN or Inf quantization scales" in line and "--allow-nonfinite" in line


def test_a_norm_whose_offset_points_at_another_tensor_is_refused(tmp_path, q4_k_m, capsys):
    """blk.0.attn_norm read blk.0.ffn_norm's data (same shape, finite values): the target was built with
    exit 0. llama.cpp requires each tensor's data right after the previous one's."""
    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(q4_k_m.read_bytes())
    norms = {t.name: t for t in model.tensors}
    norms["blk.0.attn_norm.weight"].offset = norms["blk.0.ffn_norm.weight"].offset
    path = tmp_path / "t.gguf"
    path.write_bytes(fuzz.serialise(model)[0])
    line = _refused(capsys, path, "-o", tmp_path / "out")
    assert "tensor blk.0.attn_norm.weight has its data at offset" in line and "where llama.cpp expects" in line


def test_general_alignment_stated_as_a_bool_is_refused(tmp_path, q4_k_m, capsys):
    """A BOOL true was read as an alignment of 1 (the file laid out at 1): llama.cpp requires UINT32."""
    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(q4_k_m.read_bytes())
    model.kv.insert(0, ["general.alignment", fuzz.T_BOOL, True])
    path = tmp_path / "t.gguf"
    path.write_bytes(fuzz.serialise(model)[0])
    assert "general.alignment is True (BOOL), not a UINT32" in _refused(capsys, path, "-o", tmp_path / "out")


# --- a map op's domain ---------------------------------------------------------------------------------

def test_a_map_op_refuses_a_value_it_cannot_take_naming_the_tensor_and_the_op(tmp_path, capsys):
    """ssm_a = -exp(A_log) is negative: log_negated of a positive value printed numpy's
    'invalid value encountered in log' and wrote NaN."""
    path = _patched(LLAMACPP_FILE, tmp_path / "t.gguf", "blk.0.ssm_a", "<f", 0.5)
    line = _refused(capsys, path, "-o", tmp_path / "out")
    assert ("model.layers.0.linear_attn.A_log (from blk.0.ssm_a, F32): map op log_negated: 1 of 4 values are not "
            "negative") in line


def test_the_decay_of_an_a_log_beyond_float32_is_refused():
    from gguf2ov.errors import Gguf2ovError
    from gguf2ov.maps.rules import apply_ops
    from gguf2ov.targets.layers.gated_deltanet import _negated_exp

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Gguf2ovError, match=r"A_log: 1 of its 2 exp\(A_log\) values are too large for float32"):
            _negated_exp(np.array([1.0, 100.0], np.float32), "model.layers.0.linear_attn.A_log")
        with pytest.raises(Gguf2ovError, match="x: map op log_negated .reversed.: 1 of 2 values have an exp beyond"):
            apply_ops([("log_negated", True)], np.array([1.0, 100.0], np.float32), {}, reverse=True, where="x")
        assert np.isnan(apply_ops([("log_negated", True)], np.array([np.nan, -1.0]), {}))[0]  # for the writer


# --- what fuzzing found besides ---------------------------------------------------------------------

@pytest.mark.parametrize("key, value, needle", [
    ("qwen3.rope.scaling.type", (benchmark("fuzz_gguf").T_ARR, (benchmark("fuzz_gguf").T_BOOL, [False] * 8)),
     "rope.scaling.type is [8 x bool]"),
    ("tokenizer.ggml.merges", (benchmark("fuzz_gguf").T_U32, 7), "tokenizer.ggml.merges is a int, expected an array")])
def test_a_key_of_the_wrong_type_is_one_error_line(tmp_path, q4_k_m, capsys, key, value, needle):
    fuzz = benchmark("fuzz_gguf")
    model = fuzz.parse(q4_k_m.read_bytes())
    model.kv = [kv for kv in model.kv if kv[0] != key] + [[key, *value]]
    path = tmp_path / "t.gguf"
    path.write_bytes(fuzz.serialise(model)[0])
    assert needle in _refused(capsys, path, "-o", tmp_path / "out")


# --- the vision model of a VLM folder ----------------------------------------------------------------

GEMMA4 = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-gemma4"


def test_a_nan_in_an_f16_vision_weight_is_refused_naming_it(tmp_path, capsys):
    """One NaN in an F16 weight of the mmproj (what one flipped byte makes): the VLM folder was written with
    NaN in its vision embeddings model, exit 0 and every target check passed. It is refused as a NaN in the
    text file is, naming the tensor, and `--allow-nonfinite` writes it, counted."""
    mmproj = _patched(GEMMA4 / "mmproj-F16.gguf", tmp_path / "mmproj.gguf", "v.blk.0.ffn_up.weight", "<e", np.nan,
                      at=2 * 5)
    text = GEMMA4 / "target-Q4_K_M.gguf"
    line = _refused(capsys, text, "--mmproj", mmproj, "-o", tmp_path / "out")
    assert line.splitlines()[0] == (
        f"error: --mmproj {mmproj}: model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight (from "
        "v.blk.0.ffn_up.weight, F16) holds 1 NaN or Inf values of 2048: the tensor's data (or its quantization "
        "scales) in the file is broken")
    assert "--allow-nonfinite" in line.splitlines()[1]
    code, err, numpy_warnings = _target(capsys, text, "--mmproj", mmproj, "-o", tmp_path / "out", "--allow-nonfinite",
                                        "--json", tmp_path / "report.json")
    assert code == 0 and not numpy_warnings, err
    name = "model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"
    assert f"warning: {name} was written with 1 NaN or Inf values (--allow-nonfinite)" in err
    assert json.loads((tmp_path / "report.json").read_text())["nonfinite"] == {name: 1}
    options = json.loads((tmp_path / "out" / "gguf2ov.json").read_text())["options"]
    assert options["nonfinite"] == {name: 1}
