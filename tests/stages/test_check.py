"""`gguf2ov check`: a correct conversion passes; each kind of broken conversion fails with its
diagnosis. Broken conversions are made the way they happen: a map with a wrong entry, a wrong
--target-layer-offset, or a converted folder with a tensor transposed, swapped or removed."""

import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from gguf2ov.checks import diagnose
from gguf2ov.cli import main
from gguf2ov.job import Job, Options
from gguf2ov.stages.check import stats
from opened import check

# Hidden 256 so K-quants apply (ne[0] % 256 == 0); 4 query heads on 2 kv heads like a real GQA draft.
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 256, 2, 4, 2, 64, 512


def _draft_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": FFN, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "vocab_size": 512, "tie_word_embeddings": False,
        "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 7, "block_size": 16},
    }


def _random_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def mat(rows, cols):
        return torch.randn(rows, cols, generator=g) * 0.02

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    sd = {"fc.weight": mat(H, 2 * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        sd |= {
            p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
            p + "self_attn.q_proj.weight": mat(HEADS * HEAD_DIM, H),
            p + "self_attn.k_proj.weight": mat(KV_HEADS * HEAD_DIM, H),
            p + "self_attn.v_proj.weight": mat(KV_HEADS * HEAD_DIM, H),
            p + "self_attn.o_proj.weight": mat(H, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": norm(HEAD_DIM), p + "self_attn.k_norm.weight": norm(HEAD_DIM),
            p + "mlp.gate_proj.weight": mat(FFN, H), p + "mlp.up_proj.weight": mat(FFN, H),
            p + "mlp.down_proj.weight": mat(H, FFN),
        }
    return {k: v.bfloat16().contiguous() for k, v in sd.items()}


def _save_checkpoint(folder, weights, config):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """A random dflash draft: the BF16 reference, its Q4_K_M GGUF, and that GGUF converted."""
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    root = tmp_path_factory.mktemp("draft")
    ref = _save_checkpoint(root / "ref", _random_weights(0), _draft_config())
    gguf = root / "draft-Q4_K_M.gguf"
    write_dflash_gguf(ref, gguf, mix="Q4_K_M")
    converted = root / "converted"
    Job.of(gguf, None, Options(progress=False)).convert(converted)
    return {"root": root, "ref": ref, "gguf": gguf, "converted": converted}


def _edited_copy(src, dst, edit):
    """A copy of checkpoint folder `src` whose tensors went through `edit(dict)`."""
    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    edit(weights)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    return dst


def _map_copy(tmp_path, edit):
    """A copy of the shipped dflash map (its skeleton merged in) with its tensors section edited."""
    from gguf2ov.maps.load import map_data

    data = map_data("dflash")
    edit(data["tensors"])
    path = tmp_path / "dflash-broken.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _only(result, code):
    """The tensors with diagnosis `code`; every failing tensor must carry that code."""
    failing = {t.name: t.diagnosis for t in result.tensors if t.status != "pass"}
    assert failing and set(failing.values()) == {code}, failing
    return sorted(failing)


# --- correct conversions -------------------------------------------------------------------------

def test_fixture_q4_k_m_passes(fixtures_dir):
    result = check(fixtures_dir / "draft-Q4_K_M.gguf", fixtures_dir / "draft-ref", progress=False)
    assert result.passed, result.summary()
    by_qtype = {q.qtype: q for q in result.by_qtype}
    assert by_qtype["Q4_K"].min_pearson >= 0.99
    assert all(c.agrees for c in result.config) and result.config


def test_a_strict_threshold_blames_quantization_not_the_mapping(fixtures_dir):
    result = check(fixtures_dir / "draft-Q4_K_M.gguf", fixtures_dir / "draft-ref", min_corr=0.998, progress=False)
    assert not result.passed
    failed = [t for t in result.tensors if t.status != "pass"]
    assert failed and {t.diagnosis for t in failed} == {"below_threshold"}
    assert {t.qtype for t in failed} == {"Q4_K"}
    assert "other_model" not in {d.code for d in result.diagnoses}


def test_fixture_legacy_gguf_names_the_shift(fixtures_dir):
    legacy, ref = fixtures_dir / "draft-legacy-Q4_K_M.gguf", fixtures_dir / "draft-ref"
    result = check(legacy, ref, progress=False)
    (bad,) = [c for c in result.config if not c.agrees]
    assert bad.key == "target_layer_ids" and "first llama.cpp DFlash converter" in bad.detail
    assert "--target-layer-offset 0" in bad.detail
    assert check(legacy, ref, target_layer_offset=0, progress=False).passed


def test_synthetic_q4_k_m_passes(draft):
    result = check(draft["gguf"], draft["ref"], progress=False)
    assert result.passed, result.summary()
    by_qtype = {q.qtype: q for q in result.by_qtype}
    assert {"Q4_K", "Q6_K", "F32"} <= set(by_qtype)
    assert 0.99 <= by_qtype["Q4_K"].mean_pearson < 1.0
    assert by_qtype["F32"].min_pearson == pytest.approx(1.0)
    assert len(result.tensors) == 3 + 11 * LAYERS
    assert {c.key for c in result.config} >= {"hidden_size", "num_key_value_heads", "target_layer_ids",
                                              "mask_token_id", "block_size", "head_dim"}


def test_converted_folder_passes(draft):
    result = check(draft["converted"], draft["ref"], progress=False)
    assert result.passed, result.summary()


def test_sharded_reference_and_source(draft, tmp_path):
    sharded = tmp_path / "sharded"
    Job.of(draft["gguf"], None, Options(progress=False)).convert(sharded, dtype="f32", max_shard_size=1 << 20)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert check(draft["converted"], sharded, progress=False).passed
    assert check(sharded, draft["ref"], progress=False).passed


# --- broken conversions, each with its diagnosis -------------------------------------------------

def test_transposed_non_square(draft, tmp_path):
    broken = _edited_copy(draft["converted"], tmp_path / "t", lambda w: w.update({"fc.weight": w["fc.weight"].T}))
    result = check(broken, draft["ref"], progress=False)
    assert not result.passed
    assert _only(result, "transposed") == ["fc.weight"]
    assert {t.name: t.status for t in result.tensors}["fc.weight"] == "shape_mismatch"


def test_transposed_square(draft, tmp_path):
    name = "layers.0.self_attn.o_proj.weight"  # 256 x 256: the shape cannot tell
    broken = _edited_copy(draft["converted"], tmp_path / "t", lambda w: w.update({name: w[name].T}))
    assert _only(check(broken, draft["ref"], progress=False), "transposed") == [name]


def test_gate_up_swapped_in_map(draft, tmp_path):
    def swap(tensors):
        tensors["blk.{N}.ffn_gate.weight"], tensors["blk.{N}.ffn_up.weight"] = \
            tensors["blk.{N}.ffn_up.weight"], tensors["blk.{N}.ffn_gate.weight"]

    result = check(draft["gguf"], draft["ref"], map_path=_map_copy(tmp_path, swap), progress=False)
    names = _only(result, "swapped")
    assert names == [f"layers.{i}.mlp.{p}_proj.weight" for i in range(LAYERS) for p in ("gate", "up")]
    detail = {t.name: t.detail for t in result.tensors}
    assert "layers.0.mlp.up_proj.weight" in detail["layers.0.mlp.gate_proj.weight"]


def test_q_k_swapped(draft, tmp_path):
    # With GQA q and k differ in shape, so no map can swap them: the converted folder is edited.
    q, k = "layers.1.self_attn.q_proj.weight", "layers.1.self_attn.k_proj.weight"

    def swap(w):
        w[q], w[k] = w[k], w[q]

    result = check(_edited_copy(draft["converted"], tmp_path / "s", swap), draft["ref"], progress=False)
    assert _only(result, "swapped") == [k, q]
    assert k in {t.name: t.detail for t in result.tensors}[q]


def test_qk_unpermuted_although_never_permuted(draft, tmp_path):
    def add_op(tensors):
        tensors["blk.{N}.attn_q.weight"] = {"to": "layers.{N}.self_attn.q_proj.weight",
                                            "ops": [{"unpermute_qk": {"heads": "num_attention_heads"}}]}

    result = check(draft["gguf"], draft["ref"], map_path=_map_copy(tmp_path, add_op), progress=False)
    flagged = _only(result, "qk_permuted")
    assert flagged == [f"layers.{i}.self_attn.q_proj.weight" for i in range(LAYERS)]
    details = {t.name: t.detail for t in result.tensors}
    for n in flagged:
        assert "was un-permuted although llama.cpp never permuted it; drop the unpermute_qk op" in details[n], \
            (n, details[n])


def test_target_layer_offset_wrong(draft):
    result = check(draft["gguf"], draft["ref"], target_layer_offset=0, progress=False)
    assert not result.passed
    assert all(t.status == "pass" for t in result.tensors)
    bad = [c for c in result.config if not c.agrees]
    assert [c.key for c in bad] == ["target_layer_ids"]
    assert bad[0].diagnosis == "config_mismatch"
    assert "shifted by +1" in bad[0].detail and "--target-layer-offset -1" in bad[0].detail


def test_older_converter_layout(draft, tmp_path):
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    old = tmp_path / "old.gguf"
    write_dflash_gguf(draft["ref"], old, mix="Q8_0", legacy=True)
    result = check(old, draft["ref"], progress=False)
    (bad,) = [c for c in result.config if not c.agrees]
    assert "shifted by -1" in bad.detail and "first llama.cpp DFlash converter" in bad.detail
    assert "--target-layer-offset 0" in bad.detail
    assert check(old, draft["ref"], target_layer_offset=0, progress=False).passed


def test_missing_tensor(draft, tmp_path):
    name = "layers.1.mlp.up_proj.weight"
    broken = _edited_copy(draft["converted"], tmp_path / "m", lambda w: w.pop(name))
    result = check(broken, draft["ref"], progress=False)
    assert _only(result, "missing") == [name]


def test_misnamed_tensor_is_extra_and_missing(draft, tmp_path):
    name = "layers.1.mlp.up_proj.weight"
    broken = _edited_copy(draft["converted"], tmp_path / "m",
                          lambda w: w.update({"layers.1.mlp.upp.weight": w.pop(name)}))
    result = check(broken, draft["ref"], progress=False)
    status = {t.name: (t.status, t.detail) for t in result.tensors if t.status != "pass"}
    assert status[name][0] == "missing" and "layers.1.mlp.upp.weight" in status[name][1]
    assert status["layers.1.mlp.upp.weight"][0] == "extra" and name in status["layers.1.mlp.upp.weight"][1]


def test_reference_of_another_model(draft, tmp_path):
    other = _save_checkpoint(tmp_path / "other", _random_weights(1), _draft_config())
    result = check(draft["gguf"], other, progress=False)
    assert not result.passed
    assert result.diagnoses[0].code == "other_model"
    assert {t.diagnosis for t in result.tensors if len(t.shape) == 2} == {"other_model"}


def test_non_finite_and_scale_offset(draft, tmp_path):
    def edit(w):
        w["norm.weight"] = w["norm.weight"].clone()
        w["norm.weight"][3] = float("nan")
        w["hidden_norm.weight"] = w["hidden_norm.weight"] + 1  # Gemma's w + 1, not undone

    result = check(_edited_copy(draft["converted"], tmp_path / "n", edit), draft["ref"], progress=False)
    diag = {t.name: (t.status, t.diagnosis) for t in result.tensors if t.status != "pass"}
    assert diag == {"norm.weight": ("non_finite", "non_finite"), "hidden_norm.weight": ("fail", "scale_offset")}


def test_config_mismatch(draft, tmp_path):
    broken = tmp_path / "c"
    shutil.copytree(draft["converted"], broken)
    config = json.loads((broken / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = 8
    (broken / "config.json").write_text(json.dumps(config))
    result = check(broken, draft["ref"], progress=False)
    assert [(c.key, c.ours, c.reference) for c in result.config if not c.agrees] == [("mask_token_id", 8, 7)]
    assert not result.passed


# --- statistics ----------------------------------------------------------------------------------

def test_stats_match_numpy_in_float64_across_chunks(monkeypatch):
    monkeypatch.setattr(diagnose, "CHUNK", 1000)  # many chunks on a small array
    rng = np.random.default_rng(0)
    ref = (1 + 1e-3 * rng.standard_normal(10_007)).astype(np.float32)  # a norm: tiny spread around 1
    ours = (ref + 1e-4 * rng.standard_normal(ref.size)).astype(np.float32)
    s = stats(ours, ref)
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    assert s.pearson == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-9)
    assert s.cosine == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-12)
    assert s.rel_err == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-9)
    assert s.max_abs == pytest.approx(np.abs(a - b).max())
    constant = np.ones(64, np.float32)
    assert stats(constant, constant).pearson is None and stats(constant, constant).cosine == 1.0


# --- command line and reports --------------------------------------------------------------------

def test_cli_reports_and_exit_codes(draft, tmp_path, capsys):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["check", str(draft["gguf"]), "--reference", str(draft["ref"]), "--json", str(js),
                 "--markdown", str(md)]) == 0
    report = json.loads(js.read_text())
    assert report["passed"] is True
    assert {"name", "shape", "qtype", "pearson", "cosine", "rel_err", "max_abs", "status", "diagnosis"} \
        <= set(report["tensors"][0])
    assert {"key", "ours", "reference", "agrees"} <= set(report["config"][0])
    assert "Per quant type" in md.read_text() and "PASS" in capsys.readouterr().out

    assert main(["check", str(draft["gguf"]), "--reference", str(draft["ref"]), "--target-layer-offset", "0",
                 "--min-corr", "0.999"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("check ") and "FAIL" in out and "--target-layer-offset -1" in out


def test_terminal_view_limits_rows(draft, tmp_path):
    from gguf2ov.report import render
    from gguf2ov.stages.check import TerminalView

    other = _save_checkpoint(tmp_path / "other", _random_weights(2), _draft_config())
    result = check(draft["converted"], other, progress=False)
    text = render(TerminalView(result, limit=5), "text")
    assert f"... {len(result.tensors) - 5} more" in text
    markdown = render(result, "markdown")
    assert all(t.name in markdown for t in result.tensors)


def test_errors_name_the_problem(draft, tmp_path):
    from gguf2ov.errors import Gguf2ovError

    with pytest.raises(Gguf2ovError, match="no model.safetensors"):
        check(draft["gguf"], tmp_path, progress=False)
    with pytest.raises(Gguf2ovError, match="GGUF source"):
        check(draft["converted"], draft["ref"], target_layer_offset=0, progress=False)
    with pytest.raises(Gguf2ovError, match="min-corr"):
        check(draft["gguf"], draft["ref"], min_corr=1.5, progress=False)


def test_missing_config_is_not_a_pass(draft, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(draft["converted"], bare)
    (bare / "config.json").unlink()
    result = check(bare, draft["ref"], progress=False)
    assert all(t.status == "pass" for t in result.tensors) and not result.passed
    assert [d.code for d in result.diagnoses] == ["no_config"]


def test_folder_source_reads_recorded_qtypes(draft, tmp_path):
    folder = tmp_path / "q"
    shutil.copytree(draft["converted"], folder)
    record = json.loads((folder / "gguf2ov.json").read_text())
    record["qtypes"] = {"fc.weight": "Q4_K"}
    (folder / "gguf2ov.json").write_text(json.dumps(record))
    qtypes = {t.name: t.qtype for t in check(folder, draft["ref"], progress=False).tensors}
    assert qtypes["fc.weight"] == "Q4_K" and qtypes["norm.weight"] == "-"


def test_convert_with_reference(draft, tmp_path, capsys):
    gguf, ref = str(draft["gguf"]), str(draft["ref"])
    assert main(["convert", gguf, "-o", str(tmp_path / "ok"), "--reference", ref]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["convert", gguf, "-o", str(tmp_path / "bad"), "--reference", ref, "--target-layer-offset", "0",
                 "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "shifted by +1" in out
    assert (tmp_path / "bad" / "model.safetensors").is_file()  # written, then found wrong
