"""Requantized variants and drift tables, on the committed fixture draft and target."""

import json

import numpy as np
import pytest

from gguf2ov import cli
from gguf2ov.errors import Gguf2ovError
from gguf2ov.job import Job, Options
from gguf2ov.ir.variants import parse_variant, variant_from_flags


def test_variant_names_round_trip_and_bad_names_are_refused():
    for name in ("fp32", "fp16", "gguf", "int8", "int8_sym", "int4_sym_g16", "int4_asym_g128", "int4_asym_g32_r0.8_all"):
        assert parse_variant(name).name == name
    assert parse_variant("int4").group_size == 16  # a Q4_K sub-block holds two groups of 16
    assert variant_from_flags("int4", sym=True).name == "int4_sym_g16"
    for bad in ("int3", "int8_g16", "int4_g16_r1.5", "q4_k"):
        with pytest.raises(Gguf2ovError):
            parse_variant(bad)
    with pytest.raises(Gguf2ovError, match="int4"):
        variant_from_flags("int8", group_size=32)
    with pytest.raises(Gguf2ovError, match="apply to int8/int4"):
        variant_from_flags("fp16", sym=True)


@pytest.fixture(scope="module")
def drift_run(fixtures_dir, tmp_path_factory):

    out = tmp_path_factory.mktemp("drift") / "variants"
    result = Job.of(fixtures_dir / "draft-Q4_K_M.gguf", fixtures_dir / "target", Options(progress=False)).drift(out, variants=["fp32", "int8", "int4_asym_g16", "int4_asym_g128", "gguf"])
    return out, result


@pytest.mark.slow
def test_drift_writes_table_files_plot_and_complete_variants(drift_run):
    out, result = drift_run
    report = json.loads((out / "drift.json").read_text())
    assert [v["name"] for v in report["variants"]] == ["fp32", "int8", "int4_asym_g16", "int4_asym_g128", "gguf"]
    for v in report["variants"]:
        assert {"name", "size_bytes", "rel_err", "cosine", "top1_agreement", "kld"} <= set(v)
        assert v["verified"] is True
        folder = out / v["name"]
        assert {"openvino_model.xml", "openvino_model.bin", "config.json", "gguf2ov.json"} <= {p.name for p in folder.iterdir()}
    assert (out / "drift.md").read_text().count("|") > 20
    png = (out / "drift.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert result.contexts == "target" and result.n_rows > 50


@pytest.mark.slow
def test_drift_ranks_variants_as_a_user_expects(drift_run):
    _, result = drift_run
    v = {x.name: x for x in result.variants}
    assert v["fp32"].rel_err == 0 and v["fp32"].top1_agreement == 1.0
    # fp32 is exported from the dequantized GGUF values, so it holds the GGUF grid exactly
    assert v["fp32"].rel_err_gguf == 0
    assert v["int8"].rel_err < v["int4_asym_g16"].rel_err < v["int4_asym_g128"].rel_err
    assert v["int4_asym_g16"].size_bytes < v["int8"].size_bytes < v["fp32"].size_bytes
    # NNCF chooses its own scales: a second rounding of the Q4_K grid, at any group size
    assert v["int4_asym_g16"].rel_err_gguf > 0.01
    # the transcoded variant carries the file's own codes: float32 rounding only
    assert v["gguf"].rel_err_gguf < 1e-6 and v["gguf"].top1_agreement == 1.0 and v["gguf"].kld < 1e-9
    assert v["gguf"].size_bytes < 0.5 * v["fp32"].size_bytes
    assert 0 < v["int4_asym_g128"].top1_agreement < 1


@pytest.mark.slow
def test_gguf_variant_stores_the_codes_compressed(drift_run):
    import openvino as ov

    out, _ = drift_run
    model = ov.Core().read_model(str(out / "gguf" / "openvino_model.xml"))
    types = {str(op.get_output_element_type(0)) for op in model.get_ops() if op.get_type_name() == "Constant"}
    assert any("u4" in t or "uint4" in t for t in types)
    rt = model.get_rt_info()
    assert rt["dflash_mode"].astype(str) == "True"


@pytest.mark.slow
def test_export_int4_keeps_rt_info_and_passes_verify(fixtures_dir, tmp_path):

    r = Job.of(fixtures_dir / "draft-Q4_K_M.gguf", None, Options(progress=False)).export(tmp_path / "int4", parse_variant("int4"))
    assert r.weight_format == "int4_asym_g16"
    assert r.verify.ok
    assert r.rt_info.get("dflash_mode") == "True"


def test_drift_refuses_bad_variants_before_any_work(tmp_path, capsys):
    code = cli.main(["drift", str(tmp_path / "missing.gguf"), "-o", str(tmp_path / "out"), "--variants", "fp32,int5"])
    err = capsys.readouterr().err
    assert code == 1 and "unknown variant 'int5'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gguf_variant_needs_a_gguf_source(fixtures_dir, tmp_path):

    with pytest.raises(Gguf2ovError, match="GGUF"):
        Job.of(fixtures_dir / "draft-ref").export(tmp_path / "x", parse_variant("gguf"))
    assert not (tmp_path / "x").exists()


def test_weight_drift_sums_over_tensors_chunk_by_chunk(monkeypatch):
    from gguf2ov.stages.drift import StreamingSums

    monkeypatch.setattr(StreamingSums, "CHUNK", 3)  # tensors span several chunks
    overall = StreamingSums()
    assert overall.add(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)) == (0.0, 1.0)
    rel, cos = overall.add(np.full((2, 2), 2.0, np.float32), np.full((2, 2), 1.0, np.float32))
    assert rel == pytest.approx(1.0) and cos == pytest.approx(1.0)
    rel, cos = overall.result()
    assert rel == pytest.approx(np.sqrt(4 / 20))
    assert cos == pytest.approx(24 / np.sqrt(32 * 20))
