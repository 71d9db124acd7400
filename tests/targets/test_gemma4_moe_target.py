"""Gemma 4 targets with a mixture of experts beside the dense MLP (`gemma4_text` with enable_moe_block, Gemma
4 26B-A4B; llama.cpp's `gemma4` file with ffn_gate_inp): in every layer the dense MLP and its norm after,
and beside it a router on the un-normed stream (RMSNorm without weight, router.scale, 1/sqrt(hidden)),
softmax, top k renormalised, per_expert_scale, the experts (GELU-tanh) between their own norms, the two
branches summed before post_feedforward_layernorm (`targets/layers/gemma4_moe.py`).

Held to transformers 5.5.4's Gemma4ForCausalLM (logits and every locator over two stateful steps,
float32); to llama.cpp's converter's file of a checkpoint and llama-simple's greedy text on it; to the
CPU plugin's rewrite of the experts into GatherMatmul and OpenVINO's paged conversion (the command's own
checks); and to GenAI running it with a DFlash draft attached.
"""

import json

import pytest
import target_builders as tb

from gguf2ov.cli import main
from gguf2ov.runtime.target import TargetIR
from opened import build_target, open_target

MOE = dict(enable_moe_block=True, hidden_size_per_layer_input=0, final_logit_softcapping=30.0)
GEMMA4_MOE = {
    # 26B-A4B-like: global layers with a head twice the sliding layers', one key/value head and no v_proj
    # (attention_k_eq_v); 6 experts of width 32, 2 chosen per token; the last layer shares layer 1's keys
    # and values; a window of 4 under the 7-token first step; tied head
    "k-eq-v-top2": dict(model_type="gemma4_text", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                        attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=1,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                        sliding_window=4, num_experts=6, top_k_experts=2, moe_intermediate_size=32, **MOE),
    # 3 of 5 experts wider than the dense MLP, v_proj everywhere, untied head
    "top3-untied": dict(model_type="gemma4_text", hidden_size=48, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=16,
                        layer_types=["sliding_attention", "full_attention"], sliding_window=3, num_experts=5,
                        top_k_experts=3, moe_intermediate_size=40, tie_word_embeddings=False, **MOE),
}
SHARED = GEMMA4_MOE["k-eq-v-top2"]


@pytest.fixture(scope="module", params=list(GEMMA4_MOE))
def gemma4_moe(request, tmp_path_factory):
    """(checkpoint folder, our fp32 IR) of one geometry."""
    work = tmp_path_factory.mktemp(request.param)
    hf = tb.write_target_checkpoint(work / "hf", GEMMA4_MOE[request.param], seed=11)
    return hf, tb.target_ir(hf, work / "ours")


def _transformers(hf):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)


def test_logits_and_every_locator_equal_transformers_over_two_stateful_steps(gemma4_moe):
    """Within 1e-5 relative (measured: 1.1e-6 at most)."""
    hf, xml = gemma4_moe
    worst = tb.worst_against_transformers(xml, _transformers(hf))
    assert set(worst) == {"logits", *range(tb.config_of(hf)["num_hidden_layers"])}
    assert max(worst.values()) <= 1e-5, worst


def test_the_command_builds_it_with_every_check_passing(tmp_path, fixtures_dir):
    """`gguf2ov target` of the checkpoint: every check passes, among them the compiled model's (three
    GatherMatmul a layer, stateful and paged: the CPU plugin rewrote the tiled experts, GELU and
    per_expert_scale and all) and the paged conversion's (one paged attention per layer, the shared layer
    over its donor's cache)."""
    hf = tb.write_target_checkpoint(tmp_path / "hf", SHARED, seed=5)
    result = build_target(hf, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    checks = {c.name: c for c in result.checks}
    assert all(c.status == "pass" for c in checks.values()), [(c.name, c.reason) for c in checks.values()]
    assert checks["target-compiled"].reason.startswith("12 GatherMatmul, no Tile or ScatterElementsUpdate, "
                                                       "stateful and paged")
    assert "1 of them over an earlier layer's key/value cache (shared KV)" in checks["target-paged"].reason


def test_the_router_stays_float32_in_the_int4_target(tmp_path, fixtures_dir):
    """NNCF int4: the experts compressed as batched weights (GatherMatmul on their codes), the router kept
    in float32 as llama.cpp keeps ffn_gate_inp; every check passes."""
    import openvino as ov

    hf = tb.write_target_checkpoint(tmp_path / "hf", SHARED, seed=5)
    result = build_target(hf, tmp_path / "t", weight_format="int4", group_size=16,
                          tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    model = ov.Core().read_model(str(tmp_path / "t" / "openvino_model.xml"))
    routers = [op for op in model.get_ops() if op.get_friendly_name().endswith("router.proj/aten::linear/MatMul")]
    assert len(routers) == SHARED["num_hidden_layers"]
    for op in routers:
        weight = op.input_value(1).get_node()
        assert weight.get_type_name() == "Constant" and weight.get_element_type() == ov.Type.f32, weight


# --- llama.cpp's layout ---------------------------------------------------------------------------------

def test_a_gguf_in_llama_cpps_layout_builds_the_checkpoints_target(tmp_path, gemma4_moe):
    """The writer runs the map backwards as llama.cpp's converter writes the experts: expert_count,
    expert_used_count and expert_feed_forward_length; ffn_gate_inp (router.proj) and its .scale
    (router.scale), ffn_down_exps.scale (per_expert_scale), gate and up fused as ffn_gate_up_exps, the
    branch norms post_ffw_norm_1, pre_ffw_norm_2, post_ffw_norm_2. The target built from it is the
    checkpoint's, byte for byte; so is the target of a file with gate and up apart (ffn_gate_exps,
    ffn_up_exps: the loader reads either)."""
    import numpy as np
    from ggufs import write_gguf as write_raw

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value
    from gguf2ov.tools.gguf_writer import write_gguf

    hf, xml = gemma4_moe
    config = tb.config_of(hf)
    path = tmp_path / "g.gguf"
    write_gguf(hf, path, "gemma4", mix="F32", extra_metadata={"gemma4.vocab_size": tb.VOCAB})
    gguf = open_gguf(path)
    assert (gguf.metadata["gemma4.expert_count"], gguf.metadata["gemma4.expert_used_count"],
            gguf.metadata["gemma4.expert_feed_forward_length"]) == \
        (config["num_experts"], config["top_k_experts"], config["moe_intermediate_size"])
    e, inter, h = config["num_experts"], config["moe_intermediate_size"], config["hidden_size"]
    for n in range(config["num_hidden_layers"]):
        for name in ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale", "ffn_down_exps.weight",
                     "ffn_gate_up_exps.weight", "post_ffw_norm_1.weight", "pre_ffw_norm_2.weight",
                     "post_ffw_norm_2.weight", "ffn_gate.weight", "ffn_norm.weight", "post_ffw_norm.weight"):
            assert f"blk.{n}.{name}" in gguf.tensors, name
    assert gguf.load("blk.0.ffn_gate_up_exps.weight").shape == (e, 2 * inter, h)
    ours = tb.target_ir(path, tmp_path / "from-gguf")
    assert ours.with_suffix(".bin").read_bytes() == xml.with_suffix(".bin").read_bytes()

    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    arrays = {n: gguf.load(n) for n in gguf.tensors}
    for n in range(config["num_hidden_layers"]):
        fused = arrays.pop(f"blk.{n}.ffn_gate_up_exps.weight")
        arrays[f"blk.{n}.ffn_gate_exps.weight"] = np.ascontiguousarray(fused[:, :inter])
        arrays[f"blk.{n}.ffn_up_exps.weight"] = np.ascontiguousarray(fused[:, inter:])
    split = tmp_path / "split.gguf"
    write_raw(split, "gemma4", meta, arrays)
    ours = tb.target_ir(split, tmp_path / "from-split")
    assert ours.with_suffix(".bin").read_bytes() == xml.with_suffix(".bin").read_bytes()


def test_a_file_llama_cpps_converter_wrote_builds_the_checkpoints_target(tmp_path):
    """tests/data/gemma4-moe-llamacpp-F32.gguf: convert_hf_to_gguf.py (llama.cpp 0c1e570) of gemma4_data's
    MoE checkpoint (benchmarks/llamacpp/gemma4.py --moe). It reads back as the checkpoint (its config: the
    experts, enable_moe_block from the file's routers), the target built from it is the checkpoint's byte
    for byte, and that computes transformers' model of the checkpoint."""
    import gemma4_data
    import numpy as np

    hf = gemma4_data.write_checkpoint(tmp_path / "hf", gemma4_data.MOE_CONFIG)
    source, reference = open_target(gemma4_data.MOE_FILE), open_target(hf)
    c = source.config
    assert (c.hf.enable_moe_block, c.hf.num_experts, c.hf.top_k_experts, c.hf.moe_intermediate_size) == \
        (True, 4, 2, 32)
    assert c.layer_types == reference.config.layer_types
    assert source.expected == reference.expected
    for name in source.expected:
        np.testing.assert_array_equal(source.f32(name), reference.f32(name), err_msg=name)
    ours = tb.target_ir(gemma4_data.MOE_FILE, tmp_path / "from-gguf")
    from_hf = tb.target_ir(hf, tmp_path / "from-hf")
    assert ours.with_suffix(".bin").read_bytes() == from_hf.with_suffix(".bin").read_bytes()
    worst = tb.worst_against_transformers(ours, _transformers(hf))
    assert max(worst.values()) <= 1e-5, worst


def test_the_target_of_llama_cpps_file_generates_llama_cpps_greedy_text(tmp_path):
    """On llama-tokenize's ids of each prompt, the target built from the file llama.cpp's converter wrote
    continues greedily as llama-simple did on that file (recorded by benchmarks/llamacpp/gemma4.py --moe:
    CI has no llama.cpp), the tokens read through the file's own vocabulary."""
    import gemma4_data

    from gguf2ov.gguf.read import open_gguf

    recorded = gemma4_data.llamacpp_greedy(gemma4_data.MOE_GREEDY)
    xml = tb.target_ir(gemma4_data.MOE_FILE, tmp_path / "ours")
    ours = gemma4_data.greedy_texts(xml, open_gguf(gemma4_data.MOE_FILE), recorded)
    assert ours == [p["text"] for p in recorded["prompts"]]


# --- files and configs it cannot be built from -------------------------------------------------------------

@pytest.mark.parametrize("drop, metadata, message", [
    ("blk.1.ffn_down_exps.scale", {}, "incomplete tensor group, missing: blk.1.ffn_down_exps.scale"),
    ("blk.1.ffn_gate_up_exps.weight", {}, "incomplete tensor group, missing: blk.1.ffn_gate_up_exps.weight"),
    (None, {"gemma4.expert_used_count": 9}, "top_k_experts is 9, above num_experts 4"),
])
def test_bad_files_are_one_error_line_and_no_folder(tmp_path, capsys, drop, metadata, message):
    """llama.cpp's converter's file with one layer's per-expert scale or experts missing, or more experts
    used than it has."""
    import gemma4_data
    from ggufs import write_gguf as write_raw

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(gemma4_data.MOE_FILE)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    path = tmp_path / "bad.gguf"
    write_raw(path, "gemma4", meta | metadata, {n: gguf.load(n) for n in gguf.tensors if n != drop})
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(path), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("changes, message", [
    ({"top_k_experts": 7}, "top_k_experts is 7, above num_experts 6: a token cannot choose more experts than "
                           "there are"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size is 0, not a positive integer (enable_moe_block: a "
                                   "mixture of experts)"),
])
def test_configs_it_cannot_be_built_from_are_one_error_line_and_no_folder(tmp_path, fixtures_dir, capsys, changes,
                                                                         message):
    hf = tb.write_target_checkpoint(tmp_path / "hf", SHARED, seed=5)
    (hf / "config.json").write_text(json.dumps(tb.config_of(hf) | changes))
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(hf), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


# --- in OpenVINO GenAI, with a DFlash draft attached ---------------------------------------------------

@pytest.mark.slow
def test_genai_runs_the_target_with_a_dflash_draft_attached(tmp_path, fixtures_dir):
    """A random DFlash draft (taps at layers 1 and 3, a global layer and the shared one) attached to the
    target in GenAI's continuous-batching pipeline (the paged target, its experts as GatherMatmul): the
    greedy text with the draft is the text of the target alone, on every fixture prompt."""
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.stages.accept import run_acceptance

    hf = tb.write_target_checkpoint(tmp_path / "hf", SHARED, seed=7, vocab=512)  # the fixture tokenizer's
    result = build_target(hf, tmp_path / "target", tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    tb.random_dflash_draft(tmp_path, SHARED["hidden_size"], [1, 3])
    prompts = read_prompts(fixtures_dir / "prompts.txt")
    r = run_acceptance(TargetIR.open(tmp_path / "target"), tmp_path / "draft", prompts,
                       GenerationSettings(max_new_tokens=24, num_assistant_tokens=5, precision="f32"), progress=False)
    assert r.overall.identical, [p.first_difference for p in r.prompts]


def test_a_large_target_with_shared_kv_layers_is_checked_on_a_probe_of_its_kinds(tmp_path, fixtures_dir, monkeypatch):
    """Above the compile budget, the check compiles a small model of the target's distinct layers
    (`targets/probe.py`). Where more layers share keys and values than the probe has (E4B shares them over
    18 of its 42 layers), the probe shares them over the probed shared layers, each over an earlier probed
    layer of its type, as in the target (before: "num_kv_shared_layers is 4, not from 0 to 3", the target's
    count)."""
    from gguf2ov.ir.variants import parse_variant
    from gguf2ov.targets import probe
    from gguf2ov.targets.graph import target_forms
    from gguf2ov.targets.layers import REGISTRY

    monkeypatch.setattr(probe, "COMPILE_BUDGET", 0)
    geometry = dict(SHARED, num_hidden_layers=8, num_kv_shared_layers=4,
                    layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2)
    hf = tb.write_target_checkpoint(tmp_path / "hf", geometry, seed=5)
    result = build_target(hf, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    finding = {c.name: c for c in result.checks}["target-compiled"]
    assert finding.status == "pass", finding.reason
    assert finding.reason.startswith("12 GatherMatmul, no Tile or ScatterElementsUpdate, stateful and paged")
    assert "checked on a 4-layer model of the target's layer kinds and weight forms (standing for layers 0, 3, 4, 7" \
        in finding.reason
    source = open_target(hf)
    model, layers = probe.write_probe(tmp_path / "probe", source, target_forms(source, parse_variant("fp32")))
    attention = REGISTRY["shared_kv_attention"]
    own = [bool(attention.states(model.config, j)) for j in range(len(layers))]
    assert own == [bool(attention.states(source.config, i)) for i in layers] == [True, True, False, False]
