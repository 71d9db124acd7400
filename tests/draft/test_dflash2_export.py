"""DFlash 2 drafts through export and verify: the convolutions are in the graph, computed as the
reference computes them, in every variant; a DFlash 2 checkpoint never becomes a v1 draft silently.
"""

import json

import dflash_builders as b
import numpy as np
import openvino as ov
import pytest
from safetensors.torch import load_file, save_file

from gguf2ov.errors import Gguf2ovError
from gguf2ov.job import Job, Options
from gguf2ov.draft.reference import reference_outputs
from opened import open_draft
from gguf2ov.ir.variants import parse_variant
from gguf2ov.numerics import compile_exact
from gguf2ov.runtime.draft_ir import synthetic_steps
from gguf2ov.stages.export import export_draft
from gguf2ov.stages.verify import verify_draft
from nncf_compare import differences, nncf_compress, signatures

LAYERS = 2


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A live DFlash 2 draft, the same weights with identity convolutions, and the v1 draft those weights make."""
    root = tmp_path_factory.mktemp("dflash2")
    live = b.write_dflash2_checkpoint(root / "live", num_hidden_layers=LAYERS)
    identity = b.write_dflash2_checkpoint(root / "identity", identity=True, num_hidden_layers=LAYERS)
    v1 = root / "v1"
    v1.mkdir()
    state = load_file(str(identity / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "_conv." not in k and "candidate_selector" not in k},
              str(v1 / "model.safetensors"))
    config = json.loads((identity / "config.json").read_text())
    config["architectures"] = ["DFlashDraftModel"]
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        del config["dflash_config"][key]
    (v1 / "config.json").write_text(json.dumps(config))
    return {"live": live, "identity": identity, "v1": v1, "root": root}


def _run(xml, steps):
    request = compile_exact(xml).create_infer_request()
    request.reset_state()
    return [request.infer(feeds)["last_hidden_state"].copy() for feeds in steps]


def _steps(config):
    return synthetic_steps(config["hidden_size"], config["hidden_size"] * len(config["dflash_config"]["target_layer_ids"]),
                           block=config["dflash_config"]["block_size"], stateful=True)


@pytest.mark.parametrize("weight_format", ["fp32", "fp16", "int8", "int4"])
def test_every_variant_exports_the_convolutions_and_verifies(checkpoints, weight_format):
    out = checkpoints["root"] / f"out-{weight_format}"
    result = Job.of(checkpoints["live"], None, Options(progress=False)).export(out, parse_variant(weight_format), overwrite=True)
    assert result.verify.ok and result.dflash_version == 2
    model = ov.Core().read_model(str(out / "openvino_model.xml"))
    projections = [op for op in model.get_ops() if "kernel_projection/aten::linear/MatMul" in op.get_friendly_name()]
    assert len(projections) == 2 * LAYERS
    # the selector is named as left out, with what it costs
    assert sorted(result.left_out) == ["candidate_selector.hidden_projection.weight",
                                       "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"]
    assert any("selector stays in the checkpoint" in line and "top-1" in line for line in result.summary())


def test_the_ir_computes_the_reference_function_and_the_convolutions_matter(checkpoints):
    out = checkpoints["root"] / "fp32"
    export_draft(open_draft(checkpoints["live"]), out, overwrite=True, progress=False)
    config = json.loads((checkpoints["live"] / "config.json").read_text())
    steps = _steps(config)
    ir = _run(out / "openvino_model.xml", steps)
    ref = reference_outputs(open_draft(checkpoints["live"]), steps)
    assert max(float(np.abs(a - r).max()) for a, r in zip(ir, ref)) < 1e-4
    # the same weights without convolutions compute something else
    plain = reference_outputs(open_draft(checkpoints["v1"]), steps)
    assert min(float(np.abs(a - r).max()) for a, r in zip(ir, plain)) > 0.05


def test_identity_convolutions_give_the_v1_draft_of_the_same_weights(checkpoints):
    outs = {}
    for name in ("identity", "v1"):
        out = checkpoints["root"] / f"same-{name}"
        export_draft(open_draft(checkpoints[name]), out, overwrite=True, progress=False)
        outs[name] = _run(out / "openvino_model.xml", _steps(json.loads((checkpoints[name] / "config.json").read_text())))
    assert max(float(np.abs(a - v).max()) for a, v in zip(outs["identity"], outs["v1"])) < 1e-5


def test_the_convolutions_keep_nothing_between_calls(checkpoints):
    """Each block starts from zero rows: after two different first blocks, the same second call
    (same context, same cache) gives the same rows."""
    config = json.loads((checkpoints["live"] / "config.json").read_text())
    out = checkpoints["root"] / "rows"
    export_draft(open_draft(checkpoints["live"]), out, overwrite=True, progress=False)
    steps = _steps(config)
    first, second = steps[0], steps[1]
    other = dict(first, inputs_embeds=first["inputs_embeds"] * -3.0)  # another block, the same context
    a = _run(out / "openvino_model.xml", [first, second])[1]
    c = _run(out / "openvino_model.xml", [other, second])[1]
    np.testing.assert_array_equal(a, c)


def test_nncf_per_weight_equals_whole_model_with_convolutions(checkpoints, tmp_path):
    fp32 = tmp_path / "fp32"
    export_draft(open_draft(checkpoints["live"]), fp32, progress=False)
    for name in ("int8", "int4_asym_g16_r0.8"):
        out = tmp_path / name
        export_draft(open_draft(checkpoints["live"]), out, parse_variant(name), progress=False)
        exported = ov.Core().read_model(str(out / "openvino_model.xml"))
        whole = nncf_compress(ov.Core().read_model(str(fp32 / "openvino_model.xml")), parse_variant(name))
        assert signatures(whole) == signatures(exported)
        ov.save_model(whole, str(tmp_path / "whole.xml"), compress_to_fp16=False)
        assert differences(ov.Core().read_model(str(tmp_path / "whole.xml")), exported, name) == []


# --- the silent failure: a DFlash 2 checkpoint exported as v1 -----------------------------------------


def test_conv_tensors_with_a_v1_config_are_refused(checkpoints, tmp_path):
    ckpt = tmp_path / "half"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes((checkpoints["live"] / "model.safetensors").read_bytes())
    (ckpt / "config.json").write_text((checkpoints["v1"] / "config.json").read_text())
    with pytest.raises(Gguf2ovError, match="DFlash 2 tensors .*attention_conv.*drop them, run without an error and be "
                                           "accepted less") as e:
        Job.of(ckpt, None, Options(progress=False)).export(tmp_path / "out")
    assert "conv_kernel_size" in e.value.hint
    assert not (tmp_path / "out").exists()


def test_a_dflash2_config_without_conv_tensors_is_refused(checkpoints, tmp_path):
    ckpt = tmp_path / "noconv"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes((checkpoints["v1"] / "model.safetensors").read_bytes())
    (ckpt / "config.json").write_text((checkpoints["live"] / "config.json").read_text())
    with pytest.raises(Gguf2ovError, match=r"8 missing \(layers\.0\.attention_conv\.base_kernel") as e:
        Job.of(ckpt, None, Options(progress=False)).export(tmp_path / "out")
    assert "both convolutions" in e.value.hint


@pytest.mark.parametrize("key,value,message", [
    ("conv_group_size", None, "dflash_config.conv_group_size is None, not a positive integer"),
    ("conv_group_size", 24, "hidden_size 64 does not split into convolution groups of 24"),
    ("conv_kernel_size", "2", "conv_kernel_size is '2', not a positive integer"),
])
def test_bad_convolution_geometry_is_one_error(checkpoints, tmp_path, key, value, message):
    config = json.loads((checkpoints["live"] / "config.json").read_text())
    config["dflash_config"][key] = value
    if value is None:
        del config["dflash_config"][key]
    ckpt = tmp_path / "bad"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes((checkpoints["live"] / "model.safetensors").read_bytes())
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(Gguf2ovError, match=message):
        Job.of(ckpt, None, Options(progress=False)).export(tmp_path / "out")


@pytest.mark.parametrize("weight_format", ["fp32", "int4"])
def test_verify_flags_an_ir_without_the_convolutions(checkpoints, weight_format):
    """The v1 export of the same weights, verified against the DFlash 2 checkpoint, fails in words."""
    out = checkpoints["root"] / f"v1-{weight_format}"
    export_draft(open_draft(checkpoints["v1"]), out, parse_variant(weight_format), overwrite=True, progress=False)
    result = verify_draft(out, reference=open_draft(checkpoints["live"]))
    finding = result.finding("checkpoint-match")
    assert not result.ok and finding.status == "fail"
    assert "DFlash 2 draft (4 convolution projections)" in finding.reason
    assert "multiplies by 15 weights instead of 19" in finding.reason
    # the same IR verified against its own v1 source passes: the check is about the pairing
    assert verify_draft(out, reference=open_draft(checkpoints["v1"])).ok


def test_a_dflash2_gguf_exports_its_own_grid_for_the_convolutions(tmp_path):
    """llama.cpp's layout: conv bases F32 without `.weight`, conv projections quantized like any Linear."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    ckpt = b.write_dflash2_checkpoint(tmp_path / "ckpt", hidden_size=256, intermediate_size=512)
    write_dflash_gguf(ckpt, tmp_path / "draft.gguf", mix="Q4_K_M")
    gguf = open_gguf(tmp_path / "draft.gguf")
    assert gguf.tensors["blk.0.attn_conv_base"].ne == (256, 2, 2) and gguf.tensors["blk.0.attn_conv_base"].qtype.name == "F32"
    assert gguf.tensors["blk.0.ffn_conv_proj.weight"].qtype.name == "Q4_K"
    result = Job.of(tmp_path / "draft.gguf", None, Options(progress=False)).export(tmp_path / "out", parse_variant("gguf"))
    finding = result.verify.finding("checkpoint-match")
    assert finding.status == "pass" and "(gguf)" in finding.reason  # held to float32's tolerance
    provenance = json.loads((tmp_path / "out" / "gguf2ov.json").read_text())
    assert provenance["options"]["transcoded"] == 1 + 9  # fc and every Linear of the layer, both projections included
    assert len(result.left_out) == 3


def test_block_rows_attend_both_ways_in_optimums_class_and_the_ir(checkpoints):
    """DFlash trains the block bidirectionally (is_causal false): an earlier row sees a later one."""
    import torch
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM

    from gguf2ov.draft.config import hf_config

    draft = open_draft(checkpoints["v1"])
    model = Qwen3DFlashForCausalLM(hf_config(draft.config)).eval()
    model.load_state_dict({n: torch.from_numpy(draft.f32(n).copy()) for n in draft.names}, strict=True)
    assert all(layer.self_attn.is_causal is False for layer in model.layers)
    step = _steps(json.loads((checkpoints["v1"] / "config.json").read_text()))[0]
    changed = dict(step, inputs_embeds=step["inputs_embeds"].copy())
    changed["inputs_embeds"][:, -1] += 1.0  # only the last block row

    def first_proposal(feeds):
        with torch.no_grad():
            out = model(**{k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items() if k != "beam_idx"})
        return (out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])[0, 0].numpy()

    assert np.abs(first_proposal(step) - first_proposal(changed)).max() > 1e-3
    out = checkpoints["root"] / "both-ways"
    export_draft(open_draft(checkpoints["live"]), out, overwrite=True, progress=False)
    a, c = (_run(out / "openvino_model.xml", [feeds])[0] for feeds in (step, changed))
    assert np.abs(a[0, 0] - c[0, 0]).max() > 1e-3
