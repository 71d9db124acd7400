"""`export` writes a stateful DFlash draft IR that passes `verify`, and refuses what cannot work."""

import json

import dflash_builders as b
import numpy as np
import pytest

from opened import TargetIR
from gguf2ov import cli
from gguf2ov.errors import Gguf2ovError
from gguf2ov.ir.variants import parse_variant
from gguf2ov.job import Job, Options
from opened import open_draft
from gguf2ov.report import render
from gguf2ov.stages.export import export_draft


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return b.draft_checkpoint(tmp_path_factory)


def no_leftovers(parent):
    return not [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


@pytest.mark.slow
def test_cli_export_writes_a_verified_draft(tmp_path, checkpoint):
    out = tmp_path / "draft"
    assert cli.main(["export", str(checkpoint), "-o", str(out), "--json", str(tmp_path / "export.json")]) == 0
    assert {"openvino_model.xml", "openvino_model.bin", "config.json", "gguf2ov.json"} <= {p.name for p in out.iterdir()}
    assert no_leftovers(tmp_path) and not (out / ".scratch").exists()

    report = json.loads((tmp_path / "export.json").read_text())
    assert report["verify"]["ok"] is True
    assert report["verify"]["figures"]["max_abs_diff"] < 1e-4
    config = json.loads((checkpoint / "config.json").read_text())["dflash_config"]
    assert report["rt_info"] == {
        "dflash_mode": "True",
        "dflash/mask_token_id": str(config["mask_token_id"]),
        "dflash/target_layer_ids": ",".join(map(str, config["target_layer_ids"])),
        # the embeddings it is fitted to be fed: it states no scale, and takes what it is fed
        "dflash/embedding_input": "as_fed", "dflash/embedding_input_scale": "1.0", "dflash/embedding_applied_scale": "1.0",
    }
    assert [i[0] for i in report["inputs"]] == ["inputs_embeds", "hidden_states", "position_ids", "attention_mask", "beam_idx"]
    assert [o[0] for o in report["outputs"]] == ["last_hidden_state"]

    prov = json.loads((out / "gguf2ov.json").read_text())
    assert prov["options"]["weight_format"] == "fp32"
    assert len(prov["sources"]["source"]["sha256"]) == 64
    assert prov["packages"]["optimum-intel"] and prov["packages"]["openvino"]

    # An existing output is kept unless --overwrite.
    with pytest.raises(Gguf2ovError, match="already exists"):
        Job.of(checkpoint, None, Options(progress=False)).export(out)


@pytest.mark.slow
def test_fp16_export_passes_verify_and_halves_the_weights(tmp_path, checkpoint):
    result = Job.of(checkpoint, None, Options(progress=False)).export(tmp_path / "fp16", parse_variant("fp16"))
    assert result.verify.ok, render(result.verify)
    assert result.verify.figures["weight_precision"] == "fp16"
    assert result.verify.figures["max_abs_diff"] <= result.verify.figures["tolerance"]
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="np") as f:
        params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())
    assert result.files["openvino_model.bin"] < 0.6 * 4 * params
    for fmt in ("text", "json", "markdown"):
        assert "checkpoint-match" in render(result, fmt)


@pytest.mark.slow
def test_genai_runs_the_fp16_draft(tmp_path_factory, checkpoint):
    """An fp16 draft (weights marked as decompression) attaches, proposes, and keeps the text exact."""
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline, properties

    draft = tmp_path_factory.mktemp("genai") / "draft"
    export_draft(open_draft(checkpoint), draft, parse_variant("fp16"), progress=False)
    target, props = TargetIR.open(b.target_dir(tmp_path_factory)), properties("f32")
    alone = make_pipeline(target, "CPU", props)
    with_draft = make_pipeline(target, "CPU", props, draft)
    prompt = Prompt("The red fox lives in the forest. It likes to eat")  # the fixture's own kind of text
    base = generate(alone, prompt, generation_config(alone, 12, None), speculative=False)
    spec = generate(with_draft, prompt, generation_config(with_draft, 12, 3), speculative=True)
    assert spec.text == base.text and spec.generated == base.generated == 12
    assert spec.drafted > 0 and spec.steps > 0  # the draft ran and proposed at every step
    if b.fixture_pair():  # the trained pair: identical text alone would also come from a broken draft
        assert spec.accepted >= spec.generated // 2, (spec.accepted, spec.drafted)


def test_model_prefix_is_refused_before_export(tmp_path, checkpoint):
    prefixed = b.prefixed_checkpoint(checkpoint, tmp_path / "prefixed")
    with pytest.raises(Gguf2ovError, match=r"'model\.' prefix .*strict=False") as e:
        Job.of(prefixed, None, Options(progress=False)).export(tmp_path / "out")
    assert "model.fc.weight" in e.value.message and "strip" in e.value.hint
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


def test_wrong_fc_width_is_refused(tmp_path):
    ckpt = b.write_checkpoint(tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0, 1, 2]  # fc was trained for two layers
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(Gguf2ovError, match=r"fc\.weight \(64, 128\) != \(64, 192\)") as e:
        Job.of(ckpt, None, Options(progress=False)).export(tmp_path / "out")
    assert "target_layer_ids" in e.value.hint


def test_bad_sources_are_refused(tmp_path):
    with pytest.raises(Gguf2ovError, match="does not exist"):
        Job.of(tmp_path / "nope").export(tmp_path / "out")
    (tmp_path / "x.bin").write_bytes(b"not a gguf")
    with pytest.raises(Gguf2ovError, match="neither a GGUF"):
        Job.of(tmp_path / "x.bin").export(tmp_path / "out")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 8}))
    with pytest.raises(Gguf2ovError, match="no dflash_config"):
        Job.of(tmp_path / "ckpt").export(tmp_path / "out")
    with pytest.raises(Gguf2ovError, match="unknown variant 'int3'"):  # before the source is read
        variant = parse_variant("int3")
        Job.of(tmp_path / "nope").export(tmp_path / "out", variant)


def test_interrupt_leaves_no_output(tmp_path, checkpoint, monkeypatch, capsys):
    import gguf2ov.draft.graph as draft_graph

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(draft_graph, "build_draft_ir", interrupted)
    assert cli.main(["export", str(checkpoint), "-o", str(tmp_path / "out")]) == 130
    assert "no partial output" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


@pytest.mark.slow
def test_failed_verify_leaves_no_output(tmp_path, checkpoint, monkeypatch):
    import gguf2ov.stages.verify as verify

    def broken(draft_dir, **kwargs):
        return verify.VerifyResult(str(draft_dir), None, None, [verify.Finding("block-rows", "behaviour", "fail", "x")])

    monkeypatch.setattr(verify, "verify_draft", broken)
    with pytest.raises(Gguf2ovError, match="fails verification: block-rows"):
        Job.of(checkpoint, None, Options(progress=False)).export(tmp_path / "out")
    assert not (tmp_path / "out").exists() and no_leftovers(tmp_path)


@pytest.mark.slow
def test_export_from_gguf_passes_verify(fixture_draft_as, tmp_path_factory):
    result = fixture_draft_as("fp32")  # Job.of(the fixture GGUF).export(...), made once per session
    assert result.source_kind == "gguf" and result.verify.ok, render(result.verify)
    # against the dequantized weights, converted to f32 in the export's scratch folder
    assert result.verify.finding("checkpoint-match").status == "pass"
    from gguf2ov.stages.verify import verify_draft

    with_target = verify_draft(result.out_dir, target=TargetIR.open(b.target_dir(tmp_path_factory)))
    assert with_target.ok, render(with_target)


@pytest.mark.parametrize("weight_format", ["fp32", "int4"])
def test_a_tensor_failing_halfway_through_the_stream_leaves_no_output(tmp_path, fixtures_dir, monkeypatch, capsys,
                                                                      weight_format):
    """fp32 weights are read while OpenVINO writes the .bin, int4 ones while the graph is built."""
    from gguf2ov.gguf.read import GgufFile

    load, calls = GgufFile.load, []

    def failing(self, name):
        calls.append(name)
        if len(calls) == 12:
            raise Gguf2ovError(f"{self.path}: tensor {name}: corrupt block")
        return load(self, name)

    monkeypatch.setattr(GgufFile, "load", failing)
    out = tmp_path / "draft"
    assert cli.main(["export", str(fixtures_dir / "draft-Q4_K_M.gguf"), "-o", str(out),
                     "--weight-format", weight_format]) == 1
    err = capsys.readouterr().err
    assert "corrupt block" in err and err.count("error:") == 1 and "Traceback" not in err
    assert len(calls) == 12 and not out.exists() and no_leftovers(tmp_path)
