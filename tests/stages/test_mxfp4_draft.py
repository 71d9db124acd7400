"""A DFlash draft in MXFP4 through inspect, convert, check, export and drift.

The fixture draft's checkpoint written by the GGUF writer as `llama-quantize --pure ... MXFP4_MOE` writes it
(every weight MXFP4: a dense draft has no experts; byte for byte llama.cpp's, benchmarks/llamacpp/fixtures.py).
Every command sees gguf-py's values of the file, and the `gguf` IR holds the file's own bytes.
"""

import json

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file as load_numpy

from gguf2ov.cli import main
from gguf2ov.gguf.read import open_gguf
from gguf2ov.ir.variants import parse_variant
from gguf2ov.job import Job, Options
from gguf2ov.stages.inspect import inspect
from gguf2ov.tools.gguf_writer import write_dflash_gguf

MXFP4 = gguf.GGMLQuantizationType.MXFP4


@pytest.fixture(scope="module")
def mxfp4_draft(fixtures_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("mxfp4") / "draft-MXFP4.gguf"
    write_dflash_gguf(fixtures_dir / "draft-ref", path, mix="MXFP4_MOE", pure=True)
    return path


def _mxfp4_weights(path) -> dict[str, str]:
    """{HF name: GGUF name} of the file's MXFP4 tensors, as the map names them."""
    return {row.hf_name: row.gguf_name for row in inspect(path).tensors if row.gguf_type == "MXFP4"}


def test_inspect_lists_the_mxfp4_tensors(mxfp4_draft, capsys):
    assert main(["inspect", str(mxfp4_draft), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["map_fits"] is True and data["type_counts"] == {"MXFP4": 15, "F32": 10}
    up = next(t for t in data["tensors"] if t["gguf_name"] == "blk.0.ffn_up.weight")
    assert up["gguf_type"] == "MXFP4" and up["n_bytes"] == up["shape"][0] * up["shape"][1] // 32 * 17


def test_convert_writes_gguf_pys_values(mxfp4_draft, tmp_path):
    result = Job.of(mxfp4_draft, None, Options(progress=False)).convert(tmp_path / "hf", dtype="f32")
    tensors = load_numpy(tmp_path / "hf" / "model.safetensors")
    reader = gguf.GGUFReader(mxfp4_draft)
    stored = {t.name: t for t in reader.tensors}
    weights = _mxfp4_weights(mxfp4_draft)
    assert len(weights) == 15 and result.n_tensors == 25
    for hf_name, gguf_name in weights.items():
        want = gguf.quants.dequantize(stored[gguf_name].data, MXFP4)
        np.testing.assert_array_equal(tensors[hf_name].view(np.uint32), want.view(np.uint32))


def test_check_passes_against_the_checkpoint(mxfp4_draft, fixtures_dir, capsys):
    assert main(["check", str(mxfp4_draft), "--reference", str(fixtures_dir / "draft-ref"), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    mxfp4 = next(q for q in data["by_qtype"] if q["qtype"] == "MXFP4")
    assert mxfp4["count"] == mxfp4["passed"] == 15 and mxfp4["min_pearson"] > 0.99


def test_the_gguf_export_holds_the_files_bytes_and_values(mxfp4_draft, tmp_path):
    """`export --weight-format gguf`: verify passes, the IR holds f4e2m1 codes and f8e8m0 scales at the file's
    size, and its weights read back are the file's dequantized values bit for bit."""
    import openvino as ov

    from gguf2ov.ir.irweights import ir_weights

    result = Job.of(mxfp4_draft, None, Options(progress=False)).export(tmp_path / "ir", parse_variant("gguf"))
    assert result.verify.ok
    model = ov.Core().read_model(str(tmp_path / "ir" / "openvino_model.xml"))
    types = {op.get_output_element_type(0).get_type_name() for op in model.get_ops() if op.get_type_name() == "Constant"}
    assert {"f4e2m1", "f8e8m0"} <= types
    read = open_gguf(mxfp4_draft)
    tensor_bytes = sum(info.n_bytes for info in read.tensors.values())
    assert (tmp_path / "ir" / "openvino_model.bin").stat().st_size <= 1.01 * tensor_bytes
    back = ir_weights(tmp_path / "ir")
    for hf_name, gguf_name in _mxfp4_weights(mxfp4_draft).items():
        np.testing.assert_array_equal(back[hf_name].view(np.uint32), read.load(gguf_name).view(np.uint32))


@pytest.mark.slow
def test_drift_holds_the_gguf_variant_to_the_file(mxfp4_draft, fixtures_dir, tmp_path):
    result = Job.of(mxfp4_draft, fixtures_dir / "target", Options(progress=False)).drift(
        tmp_path / "drift", variants=["fp32", "gguf"])
    v = {r.name: r for r in result.variants}
    assert v["gguf"].rel_err_gguf == 0 and v["gguf"].top1_agreement == 1.0 and v["gguf"].kld < 1e-9
    assert v["gguf"].size_bytes < 0.25 * v["fp32"].size_bytes
