"""Requantized variants and drift tables, on the committed fixture draft and target."""

import json
from pathlib import Path

import numpy as np
import pytest

from gguf2ov import cli
from gguf2ov.errors import Gguf2ovError
from gguf2ov.job import Job, Options
from gguf2ov.ir.variants import DEFAULT_DRIFT_VARIANTS, parse_variant, variant_from_flags

# A draft of hidden size 32 (the hybrid fixture's): NNCF's group 128 divides none of its input widths
NARROW = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-hybrid" / "draft-Q4_K_M.gguf"


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


def test_a_default_variant_the_draft_cannot_take_is_skipped_and_a_named_one_refused(fixtures_dir):
    from gguf2ov.stages.drift import plan_variants

    narrow = Job.of(NARROW, None, Options(progress=False)).shaped_draft
    plan = plan_variants(narrow)
    assert [v.name for v in plan.build] == [n for n in DEFAULT_DRIFT_VARIANTS if not n.endswith("_g128")]
    assert list(plan.skipped) == ["int4_sym_g128", "int4_asym_g128"]
    why = plan.skipped["int4_asym_g128"]
    assert why.startswith("NNCF cannot compress the model as int4_asym_g128: group size 128 does not divide the "
                          "input width of 13 of the 14 weights it would compress in int4: fc.weight (96)"), why
    assert why.endswith(" and 10 more")
    with pytest.raises(Gguf2ovError, match="group size 128 does not divide") as named:
        plan_variants(narrow, ["fp32", "int4_asym_g128"])
    assert named.value.hint == "group sizes that divide every input width: 16, 32"
    # named among defaults that may be skipped (run's --requant beside its default variants)
    assert list(plan_variants(narrow, ["int8", "int4_sym_g128"], optional=["int4_sym_g128"]).skipped) == \
        ["int4_sym_g128"]
    # the fixture draft (hidden 256) takes every default; a checkpoint has no GGUF grid to carry
    assert plan_variants(Job.of(fixtures_dir / "draft-Q4_K_M.gguf").shaped_draft).skipped == {}
    checkpoint = Job.of(fixtures_dir / "draft-ref").draft
    assert list(plan_variants(checkpoint).skipped) == ["gguf"]
    assert "must be a GGUF file" in plan_variants(checkpoint).skipped["gguf"]
    with pytest.raises(Gguf2ovError, match="must be a GGUF file"):
        plan_variants(checkpoint, ["gguf"])


def test_drift_refuses_a_named_variant_the_draft_cannot_take_before_any_work(tmp_path, capsys):
    code = cli.main(["drift", str(NARROW), "-o", str(tmp_path / "out"), "--variants", "fp32,int4_sym_g128"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 2 and err[0].startswith("error: NNCF cannot compress the model as int4_sym_g128")
    assert err[1] == "hint: group sizes that divide every input width: 16, 32"
    assert not (tmp_path / "out").exists()


def test_drift_names_the_default_variants_it_skipped(tmp_path):
    """What `drift` with its defaults does on a narrow draft, on two variants: the one that cannot
    apply is skipped, and the table, the summary, drift.json and drift.md say which and why."""
    from gguf2ov.report import render
    from gguf2ov.stages.drift import drift

    out = tmp_path / "variants"
    result = drift(Job.of(NARROW).draft, out, variants=["fp32", "int4_sym_g128"], optional=["int4_sym_g128"],
                   progress=False)
    assert [v.name for v in result.variants] == ["fp32"] and not (out / "int4_sym_g128").exists()
    why = result.skipped["int4_sym_g128"]
    assert "group size 128 does not divide" in why
    text, md = render(result, "text"), (out / "drift.md").read_text()
    for shown in (text, md):
        assert f"skipped int4_sym_g128: {why}" in shown
        assert "skipped, as this draft cannot take them: int4_sym_g128" in shown  # the table's note
    data = json.loads((out / "drift.json").read_text())
    assert data["skipped"] == {"int4_sym_g128": why} and data["provenance"]["options"]["skipped"] == ["int4_sym_g128"]


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
