"""`verify` passes a correct draft and catches each silent failure with its own check."""

import json

import dflash_builders as b
import pytest

from opened import TargetIR
from gguf2ov import cli
from gguf2ov.errors import Gguf2ovError
from opened import open_draft
from gguf2ov.report import render
from gguf2ov.stages.verify import verify_draft

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return b.draft_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def good_ir(tmp_path_factory, checkpoint):
    from gguf2ov.stages.export import export_draft

    out = tmp_path_factory.mktemp("good") / "draft"
    export_draft(open_draft(checkpoint), out, progress=False)
    return out


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    return b.target_dir(tmp_path_factory)


def statuses(result) -> dict[str, str]:
    return {c.name: c.status for c in result.checks}


def failed(result) -> set[str]:
    return {c.name for c in result.checks if c.status == "fail"}


def test_correct_draft_passes_every_check(good_ir, checkpoint, target):
    result = verify_draft(good_ir, target=TargetIR.open(target), reference=open_draft(checkpoint))
    assert result.ok, render(result)
    assert set(statuses(result).values()) == {"pass"}, render(result)
    assert result.figures["rows"] == result.figures["block"] - 1
    assert result.figures["max_abs_diff"] < result.figures["tolerance"] / 10
    assert result.figures["weight_precision"] == "fp32"


def test_reports_render_in_three_formats(good_ir):
    result = verify_draft(good_ir)
    assert statuses(result)["checkpoint-match"] == "skip"  # export does not copy the safetensors
    assert "block-rows" in render(result, "text")
    assert "| interface | stateful | pass |" in render(result, "markdown")
    data = json.loads(render(result, "json"))
    assert data["ok"] is True and {c["name"] for c in data["checks"]} >= {"stateful", "rt-info", "block-rows"}


def test_draft_without_seed_row_slice_fails_block_rows(tmp_path, checkpoint, good_ir):
    ir = b.naive_export(checkpoint, tmp_path, model_class=b.no_slice_class())
    result = verify_draft(ir, reference=open_draft(checkpoint))
    # Its interface is identical to a correct draft's: only running it shows the extra row.
    assert all(statuses(result)[n] == "pass" for n in ("stateful", "inputs", "output", "state", "rt-info"))
    assert "block-rows" in failed(result)
    assert "seed row" in result.finding("block-rows").reason
    assert result.figures["rows"] == result.figures["block"]


def test_stateless_draft_fails(tmp_path, checkpoint):
    result = verify_draft(b.naive_export(checkpoint, tmp_path, stateful=False))
    assert {"stateful", "output"} <= failed(result)
    assert "stateless" in result.finding("stateful").reason
    assert "present" in result.finding("output").reason


def test_random_weights_from_a_prefixed_checkpoint(tmp_path, checkpoint):
    prefixed = b.prefixed_checkpoint(checkpoint, (tmp_path / "prefixed"))
    ir = b.naive_export(prefixed, (tmp_path / "ir"))
    result = verify_draft(ir, reference=open_draft(checkpoint))
    assert "checkpoint-match" in failed(result)
    assert result.figures["max_abs_diff"] > 0.1
    assert statuses(result)["weights"] == "warn"
    assert "untrained" in result.finding("weights").reason
    # The checkpoint it came from is refused as a reference, naming the prefix.
    with pytest.raises(Gguf2ovError, match="'model.' prefix"):
        open_draft(prefixed)


def test_mixed_layer_types_at_draft_ids_are_reported_not_failed(tmp_path, good_ir, target):
    """A tap set that mixes linear and full layers is what DFlash picks on hybrid targets: a fact to report."""
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    ids = json.loads((good_ir / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    types = ["full_attention"] * n
    types[ids[-1]] = "linear_attention"
    result = verify_draft(good_ir, target=TargetIR.open(b.target_with_config(target, tmp_path, layer_types=types)))
    assert failed(result) == set() and result.finding("layer-types").status == "pass"
    assert "a mixed set" in result.finding("layer-types").reason and "linear_attention" in \
        result.finding("layer-types").reason
    assert "1 linear_attention" in result.finding("target").reason


def test_target_geometry_mismatches_fail(tmp_path, good_ir, target):
    ids = json.loads((good_ir / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    small = b.target_with_config(target, tmp_path, num_hidden_layers=max(ids), vocab_size=1)
    result = verify_draft(good_ir, target=TargetIR.open(small))
    assert {"layer-ids", "mask-token", "target-locators"} <= failed(result)


def test_target_without_locators_only_warns(tmp_path, good_ir, target):
    bare = b.edit_ir(target, tmp_path, drop_rt_info=("hidden_states_decoder_layers",))
    result = verify_draft(good_ir, target=TargetIR.open(bare))
    finding = result.finding("target-locators")
    assert result.ok and finding.status == "warn"
    ids = json.loads((good_ir / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert f"name-pattern fallback, which finds the MLP residual add of layers {sorted(ids)}" in finding.reason


def test_target_without_locators_nor_the_pattern_fails_as_genai_would(tmp_path, good_ir, target):
    """No annotation and no Llama/Qwen-style residual add under the layer names: GenAI refuses."""
    import openvino as ov

    from gguf2ov.targets.ir import pattern_fallback_layers

    bare = b.edit_ir(target, tmp_path, drop_rt_info=("hidden_states_decoder_layers",))
    xml = bare / "openvino_model.xml"
    model = ov.Core().read_model(str(xml))
    for op in model.get_ops():  # what a post-norm block (Gemma) looks like to the pattern: no layers.N/ Add
        op.set_friendly_name(op.get_friendly_name().replace(".layers.", ".blocks."))
    ov.save_model(model, str(tmp_path / "renamed.xml"), compress_to_fp16=False)
    (tmp_path / "renamed.xml").replace(xml)
    (tmp_path / "renamed.bin").replace(bare / "openvino_model.bin")
    assert pattern_fallback_layers(ov.Core().read_model(str(xml)), [0, 1]) == {}
    result = verify_draft(good_ir, target=TargetIR.open(bare))
    finding = result.finding("target-locators")
    assert not result.ok and finding.status == "fail"
    assert "GenAI will refuse the pair" in finding.reason and "Eagle3 fallback found 0 outputs" in finding.reason


def test_missing_dflash_rt_info_fails(tmp_path, good_ir):
    ir = b.edit_ir(good_ir, tmp_path, drop_rt_info=("dflash_mode", "dflash"))
    result = verify_draft(ir)
    assert failed(result) == {"rt-info"}
    assert "dflash_mode" in result.finding("rt-info").reason


def test_rt_info_disagreeing_with_config_fails(tmp_path, good_ir):
    ir = b.edit_ir(good_ir, tmp_path, set_rt_info={"dflash/mask_token_id": "7"})
    result = verify_draft(ir)
    assert failed(result) == {"rt-info"}
    assert "mask_token_id" in result.finding("rt-info").reason


def test_missing_ir_fails(tmp_path):
    result = verify_draft(tmp_path)
    assert not result.ok and failed(result) == {"ir"}


def test_cli_exit_codes(tmp_path, good_ir, capsys):
    assert cli.main(["verify", str(good_ir), "--json", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["ok"] is True
    assert cli.main(["verify", str(tmp_path)]) == 1
    assert "verify FAIL" in capsys.readouterr().out
