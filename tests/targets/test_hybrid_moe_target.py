"""Hybrid mixture-of-experts targets (Qwen3.5 / 3.6-35B-A3B: Gated DeltaNet and gated attention layers,
each with routed experts, a shared expert and its sigmoid gate), from a `qwen3_5_moe_text` checkpoint,
the text model of a `qwen3_5_moe` VLM checkpoint and a `qwen35moe` GGUF in llama.cpp's layout.

Held to transformers 5.5.4's Qwen3_5MoeForCausalLM (logits and every locator over two stateful steps,
float32); to OpenVINO's fusions (per layer, three GatherMatmul for the experts and, per linear layer,
one GatedDeltaNet; after the paged conversion GenAI runs when a draft attaches, one PagedGatedDeltaNet
and one PagedCausalConv1D per linear layer, a paged attention per full layer, no state op left and the
GatherMatmul still there); to a file llama.cpp's own converter wrote (tests/data); and to GenAI running
the target with a DFlash draft attached. Fewer key than value heads throughout, so that the tiled value
heads of llama.cpp's layout are exercised. Bad input is one error line and no output folder.
"""

import json
from collections import Counter

import numpy as np
import pytest
import qwen35_data
import target_builders as tb
from ggufs import write_gguf

from gguf2ov.cli import main
from gguf2ov.runtime.target import TargetIR
from opened import build_target, open_target

HYBRID_MOE = {
    # layers L L L F L L L F, 8 experts top 2, 2 key / 4 value heads with dk != dv, untied head
    "grouped-top2": dict(model_type="qwen3_5_moe_text", hidden_size=64, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
                         linear_conv_kernel_dim=4, tie_word_embeddings=False),
    # layers L F L F, 16 experts top 4, one key head for three value heads, a tied head, half of each
    # attention head rotated, a conv kernel of 3
    "tied-top4-of-16": dict(model_type="qwen3_5_moe_text", hidden_size=48, moe_intermediate_size=24,
                            shared_expert_intermediate_size=32, num_experts=16, num_experts_per_tok=4,
                            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=24,
                            linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_conv_kernel_dim=3, tie_word_embeddings=True,
                            partial_rotary_factor=0.5, full_attention_interval=2),
}
GROUPED = HYBRID_MOE["grouped-top2"]
TOLERANCE = 1e-4  # relative, as the other targets against transformers (test_target_graph, test_hybrid_target)

# The checkpoint behind tests/data/qwen35moe-mtp-llamacpp-F16.gguf (qwen35_data.MOE_CONFIG), which llama.cpp's own
# converter wrote from it: one linear and one full layer, 8 experts top 2, an MTP block
LLAMACPP_FILE = qwen35_data.MOE_LLAMACPP_FILE
LLAMACPP_CONFIG = qwen35_data.MOE_CONFIG


@pytest.fixture(scope="module", params=list(HYBRID_MOE))
def hybrid_moe(request, tmp_path_factory):
    """(checkpoint folder, our fp32 IR) of one geometry."""
    work = tmp_path_factory.mktemp(request.param)
    hf = tb.write_target_checkpoint(work / "hf", HYBRID_MOE[request.param], seed=3)
    return hf, tb.target_ir(hf, work / "ours")


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    return tb.write_target_checkpoint(tmp_path_factory.mktemp("grouped") / "hf", GROUPED, seed=5)


@pytest.fixture(scope="module")
def llamacpp_checkpoint(tmp_path_factory):
    return qwen35_data.write_moe_checkpoint(tmp_path_factory.mktemp("llamacpp") / "hf")


def _transformers(hf, state=None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    if state is not None:  # the values a GGUF holds, experts fused as the model holds them
        state = dict(state)
        for i in range(model.config.num_hidden_layers):
            p = f"model.layers.{i}.mlp.experts."
            state[p + "gate_up_proj"] = np.concatenate([state.pop(p + "gate_proj"), state.pop(p + "up_proj")], axis=1)
        missing, unexpected = model.load_state_dict({n: torch.from_numpy(np.array(v)) for n, v in state.items()},
                                                    strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def _logits(xml, vocab):
    return np.concatenate([logits for logits, _ in tb.run_steps(xml, tb.steps(vocab))], axis=1)


# --- the graph against transformers; the fusions -----------------------------------------------------

def test_logits_and_every_locator_equal_transformers_over_two_stateful_steps(hybrid_moe):
    """Within 1e-4 relative (measured: 3.7e-5 for the logits of the grouped geometry, its locators
    1.6e-6 .. 2.8e-5; the tied one below 1e-5): the routed experts' choice is the same as
    transformers' at every token, or the difference would be of the order of the outputs."""
    hf, xml = hybrid_moe
    config = tb.config_of(hf)
    worst = tb.worst_against_transformers(xml, _transformers(hf))
    assert set(worst) == {"logits", *range(config["num_hidden_layers"])}
    assert max(worst.values()) <= TOLERANCE, worst


def _runtime_ops(xml, paged: bool) -> Counter:
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    from gguf2ov.numerics import EXACT, core

    model = ov.Core().read_model(str(xml))
    if paged:
        paged_attention_transformation(model)
    compiled = core().compile_model(model, "CPU", EXACT)
    return Counter(op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops())


def test_openvino_fuses_every_layer_and_pages_every_state(hybrid_moe):
    """Stateful: the CPU plugin runs three GatherMatmul per layer (only the chosen experts: nothing of
    the dense trace left), one GatedDeltaNet and its conv per linear layer. Paged (what GenAI makes of
    the target when a draft attaches): PagedGatedDeltaNet and PagedCausalConv1D per linear layer, a
    paged attention per full layer, no ReadValue/Assign left, and compiled, the GatherMatmul still
    there. The command's own checks (target-paged, target-compiled) say the same."""
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    from gguf2ov.targets.checks import compiled_finding, target_findings

    hf, xml = hybrid_moe
    c = open_target(hf).config
    linear, full = c.layer_types.count("linear_attention"), c.layer_types.count("full_attention")
    stateful = _runtime_ops(xml, paged=False)
    assert (stateful["GatherMatmul"], stateful["GatedDeltaNet"], stateful["ScaledDotProductAttention"]) == \
        (3 * c.num_layers, linear, full)
    assert stateful["Loop"] == stateful["Tile"] == stateful["ScatterElementsUpdate"] == 0
    model = ov.Core().read_model(str(xml))
    assert {f.name: f.status for f in target_findings(model, c)} == dict.fromkeys(
        ["target-inputs", "target-logits", "target-state", "target-locators", "target-embedding", "target-head",
         "target-paged", "target-positions"], "pass")
    assert len(model.get_variables()) == 2 * c.num_layers  # conv and recurrent, or key and value, per layer
    paged_attention_transformation(model)
    ops = Counter(op.get_type_name() for op in model.get_ops())
    assert (ops["PagedGatedDeltaNet"], ops["PagedCausalConv1D"], ops["PagedAttentionExtension"]) == (linear, linear, full)
    assert ops["ReadValue"] == ops["Assign"] == 0
    paged = _runtime_ops(xml, paged=True)
    assert paged["GatherMatmul"] == 3 * c.num_layers and paged["Tile"] == paged["ScatterElementsUpdate"] == 0
    finding = compiled_finding(xml, c)
    assert finding.status == "pass" and finding.reason.startswith(
        f"{3 * c.num_layers} GatherMatmul, no Tile or ScatterElementsUpdate, stateful and paged"), finding.reason


def test_every_layers_router_and_shared_gate_stay_float32(hybrid_moe):
    """The router and the shared expert's gate decide, and stay float32 Constants (as llama.cpp keeps
    ffn_gate_inp and ffn_gate_inp_shexp F32) even in an int4 target; the experts are [E, N, K]."""
    hf, _ = hybrid_moe
    source = open_target(hf)
    c = source.config
    assert set(source.kept) == {f"model.layers.{i}.mlp.{n}.weight" for i in range(c.num_layers)
                                for n in ("gate", "shared_expert_gate")}
    assert len(source.batched) == 3 * c.num_layers
    e, inter = c.hf.num_experts, c.hf.moe_intermediate_size
    assert source.expected["model.layers.0.mlp.experts.gate_proj"] == (e, inter, c.hidden_size)
    assert source.expected["model.layers.0.mlp.experts.down_proj"] == (e, c.hidden_size, inter)
    assert "model.layers.0.mlp.gate_proj.weight" not in source.expected and c.intermediate_size == 0


# --- a file llama.cpp's own converter wrote --------------------------------------------------------------

def test_a_file_llama_cpps_converter_wrote_reads_as_its_checkpoint(llamacpp_checkpoint):
    """Every tensor of tests/data/qwen35moe-mtp-llamacpp-F16.gguf reads back as the checkpoint's: the
    experts split from gate_up_proj into ffn_gate_exps / ffn_up_exps, the router and the shared gate
    (F32), the tiled value heads un-tiled; the norms' + 1 and ssm_a = -exp(A_log) are llama.cpp's float32
    arithmetic. The MTP block (with its experts) is dropped."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.hf.checkpoint import Checkpoint

    gguf = open_gguf(LLAMACPP_FILE)
    meta = gguf.metadata
    assert (meta["qwen35moe.expert_count"], meta["qwen35moe.expert_used_count"],
            meta["qwen35moe.expert_feed_forward_length"], meta["qwen35moe.expert_shared_feed_forward_length"],
            meta["qwen35moe.block_count"], meta["qwen35moe.nextn_predict_layers"]) == (8, 2, 16, 16, 3, 1)
    assert "qwen35moe.feed_forward_length" not in meta
    types = {n: t.qtype.name for n, t in gguf.tensors.items()}
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.ffn_gate_inp_shexp.weight"] == "F32"
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.2.ffn_down_exps.weight"] == "F16"  # the MTP block's too
    source = open_target(LLAMACPP_FILE)
    c = source.config
    assert (c.num_layers, c.layer_types, c.raw["mtp_num_hidden_layers"]) == (2, ("linear_attention", "full_attention"), 1)
    checkpoint = Checkpoint(llamacpp_checkpoint)
    exact = 0
    for name in source.expected:
        if ".mlp.experts." in name and not name.endswith("down_proj"):
            fused = checkpoint.load("model.language_model." + name[len("model."):].rsplit(".", 1)[0] + ".gate_up_proj")
            inter = fused.shape[1] // 2
            ref = fused[:, :inter] if name.endswith("gate_proj") else fused[:, inter:]
        else:
            ref = checkpoint.load("model.language_model." + name[len("model."):])
        np.testing.assert_allclose(source.f32(name), ref, rtol=1e-6, atol=1e-7, err_msg=name)
        exact += bool(np.array_equal(source.f32(name), ref))
    assert exact >= len(source.expected) - 8  # 7 norms + 1 and A_log


def test_a_shared_gate_without_its_trailing_1_reads_as_the_converters(tmp_path):
    """llama-quantize writes the shared expert's gate [1, H] (ne {H, 1}) as ne {H}, which llama.cpp's
    loader asks for; a file either way reads to the checkpoint's [1, H] and builds the same plan."""
    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(LLAMACPP_FILE)
    gates = {n: gguf.load(n) for n in gguf.tensors if n.endswith("ffn_gate_inp_shexp.weight")}
    assert gates and all(g.shape[0] == 1 and g.ndim == 2 for g in gates.values())
    flat = _rewrite(LLAMACPP_FILE, tmp_path / "flat.gguf", tensors={n: g.reshape(-1) for n, g in gates.items()})
    assert all(len(open_gguf(flat).tensors[n].shape) == 1 for n in gates)
    converted, quantized = open_target(LLAMACPP_FILE), open_target(flat)
    assert sorted(converted.expected) == sorted(quantized.expected)
    for name in converted.expected:
        if name.endswith("shared_expert_gate.weight"):
            assert quantized.f32(name).shape == converted.f32(name).shape == (1, gates["blk.0.ffn_gate_inp_shexp.weight"].shape[1])
            np.testing.assert_array_equal(quantized.f32(name), converted.f32(name))


def test_the_target_from_llama_cpps_file_computes_transformers_model_and_the_checkpoints_target(
        tmp_path, llamacpp_checkpoint):
    """The target built from the GGUF against transformers on the checkpoint, and against the target
    built from the checkpoint (measured: logits 1.2e-7 apart, the norms' + 1 rounded by llama.cpp)."""
    from_gguf = tb.target_ir(LLAMACPP_FILE, tmp_path / "gguf")
    worst = tb.worst_against_transformers(from_gguf, _transformers(llamacpp_checkpoint))
    assert max(worst.values()) <= TOLERANCE, worst
    from_checkpoint = tb.target_ir(llamacpp_checkpoint, tmp_path / "checkpoint")
    vocab = LLAMACPP_CONFIG["vocab_size"]
    assert tb.relative(_logits(from_gguf, vocab), _logits(from_checkpoint, vocab)) <= 1e-6


# --- formats -----------------------------------------------------------------------------------------

def _weight_types(xml) -> dict[str, str]:
    """{MatMul name: element type of the constant its weight is stored in}."""
    import openvino as ov

    from gguf2ov.ir.irweights import weight_constants

    return {name: c.get_output_element_type(0).get_type_name()
            for name, c in weight_constants(ov.Core().read_model(str(xml))).items()}


def _kinds(types: dict) -> dict[str, set]:
    """The element types of the weights by part: Gated DeltaNet projections, experts, routers and shared
    gates, the shared expert."""
    parts = {"linear_attn": set(), "experts": set(), "routers": set(), "shared_expert": set()}
    for name, t in types.items():
        if ".linear_attn." in name:
            parts["linear_attn"].add(t)
        elif ".mlp.experts/" in name:
            parts["experts"].add(t)
        elif name.endswith(("mlp.gate/aten::linear/MatMul", "mlp.shared_expert_gate/aten::linear/MatMul")):
            parts["routers"].add(t)
        elif ".mlp.shared_expert." in name:
            parts["shared_expert"].add(t)
    return parts


@pytest.mark.slow
@pytest.mark.parametrize("weight_format, want", [
    ("fp16", {"linear_attn": {"f16"}, "experts": {"f16"}, "shared_expert": {"f16"}}),
    ("int8", {"linear_attn": {"u8"}, "experts": {"u8"}, "shared_expert": {"u8"}}),
    # int4 keeps the Gated DeltaNet projections in int8 (int4 corrupts them), as for qwen35
    ("int4", {"linear_attn": {"u8"}, "experts": {"u4"}, "shared_expert": {"u4"}})])
def test_every_nncf_and_float_format_from_the_checkpoint(tmp_path, grouped, fixtures_dir, weight_format, want):
    """The command's checks pass (GatherMatmul per layer compiled, stateful and paged, the paged
    states), the routers and shared gates float32 in every format."""
    result = build_target(grouped, tmp_path / "t", weight_format=weight_format, tokenizer_dir=fixtures_dir / "target-hf",
                          group_size=16 if weight_format == "int4" else None)
    checks = {c.name: c for c in result.checks}
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    assert checks["target-compiled"].reason.startswith("24 GatherMatmul, no Tile or ScatterElementsUpdate")
    parts = _kinds(_weight_types(tmp_path / "t" / "openvino_model.xml"))
    assert parts == {**want, "routers": {"f32"}}, parts
    if weight_format == "int4":
        kept = [n for n, why in result.nncf_backup_why.items() if why.startswith("Gated DeltaNet")]
        assert len(kept) == 6 * 5


def _write_with_writer(hf, path, mix):
    """The checkpoint as a qwen35moe GGUF, the map run backwards (llama.cpp's layout; the checkpoint's
    fused gate_up_proj as ffn_gate_up_exps, the converter's --fuse-gate-up-exps layout)."""
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    write_from_checkpoint(hf, path, "qwen35moe", mix=mix, extra_metadata={"qwen35moe.vocab_size": tb.VOCAB})
    return path


@pytest.mark.slow
@pytest.mark.parametrize("grid", ["split", "compact"])
def test_the_gguf_grid_keeps_the_expert_axis_and_computes_the_files_model(tmp_path, grouped, fixtures_dir,
                                                                         grid):
    """A Q8_0 file's grid carried by every weight: the experts' [E, N, K/32, 32] codes stay compressed on
    the fused GatherMatmul (i8), the Gated DeltaNet projections keep theirs, the routers are the file's
    F32. The target computes transformers' model on the file's dequantized values."""
    path = _write_with_writer(grouped, tmp_path / "q.gguf", "Q8_0")
    result = build_target(path, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf", grid=grid)
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    assert "(fused weights: 24 i8)" in {c.name: c for c in result.checks}["target-compiled"].reason
    from gguf2ov.gguf.read import open_gguf

    # every Q8_0 tensor on its grid, the fused gate_up as its two halves (ffn_down_shexp, 48 wide, is
    # F16: no 32-block fits its rows)
    quantized = [n for n, t in open_gguf(path).tensors.items() if t.qtype.name == "Q8_0"]
    assert result.transcoded == len(quantized) + sum(n.endswith("ffn_gate_up_exps.weight") for n in quantized)
    source = open_target(path)
    xml = tmp_path / "t" / "openvino_model.xml"
    parts = _kinds(_weight_types(xml))
    assert parts["routers"] == {"f32"} and parts["experts"] == {"i8"} and parts["linear_attn"] <= {"i8", "u8"}
    worst = tb.worst_against_transformers(xml, _transformers(grouped, {n: source.f32(n) for n in source.expected}))
    assert max(worst.values()) <= TOLERANCE, worst


# --- checkpoints -------------------------------------------------------------------------------------

def _vlm_from(text_hf, vlm):
    """The hub's Qwen3_5MoeForConditionalGeneration layout of a text checkpoint: a qwen3_5_moe config with a
    text_config and a vision_config, the language model under model.language_model., a vision tower and
    an MTP block."""
    from safetensors.numpy import load_file, save_file

    vlm.mkdir()
    text = tb.config_of(text_hf)
    config = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
              "text_config": {k: v for k, v in text.items() if k not in ("architectures", "tie_word_embeddings")},
              "vision_config": {"depth": 1, "hidden_size": 16, "out_hidden_size": text["hidden_size"]},
              "tie_word_embeddings": text["tie_word_embeddings"]}
    (vlm / "config.json").write_text(json.dumps(config))
    state = load_file(str(text_hf / "model.safetensors"))
    state["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((48, 16), np.float32)
    state["mtp.layers.0.mlp.experts.gate_up_proj"] = np.zeros((8, 64, 64), np.float32)
    state["mtp.fc.weight"] = np.zeros((64, 128), np.float32)
    save_file(state, str(vlm / "model.safetensors"))
    return vlm


def _per_expert_from(text_hf, out):
    """The checkpoint with one 2-D tensor per expert (`model.language_model.layers.N.mlp.experts.E.
    gate_proj.weight`, ...), the layout transformers 5.2's conversion mapping merges on loading."""
    from safetensors.numpy import load_file, save_file

    out.mkdir()
    state = {}
    for name, value in load_file(str(text_hf / "model.safetensors")).items():
        if name.endswith("mlp.experts.gate_up_proj"):
            inter = value.shape[1] // 2
            for e in range(value.shape[0]):
                state[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = np.ascontiguousarray(value[e, :inter])
                state[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = np.ascontiguousarray(value[e, inter:])
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(value.shape[0]):
                state[name.replace("down_proj", f"{e}.down_proj.weight")] = value[e]
        else:
            state[name] = value
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text((text_hf / "config.json").read_text())
    return out


def test_the_vlm_and_per_expert_checkpoints_build_the_text_checkpoints_target(tmp_path, grouped, fixtures_dir):
    """The text model of a qwen3_5_moe VLM checkpoint (config.json its text config), and a checkpoint
    with one tensor per expert under model.language_model.: the same IR as from the text checkpoint."""
    tok = fixtures_dir / "target-hf"
    build_target(grouped, tmp_path / "from-text", tokenizer_dir=tok)
    want = (tmp_path / "from-text" / "openvino_model.bin").read_bytes()
    build_target(_vlm_from(grouped, tmp_path / "vlm"), tmp_path / "from-vlm", tokenizer_dir=tok)
    assert (tmp_path / "from-vlm" / "openvino_model.bin").read_bytes() == want
    written = json.loads((tmp_path / "from-vlm" / "config.json").read_text())
    assert written["model_type"] == "qwen3_5_moe_text" and written["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert written["num_experts"] == 8 and written["layer_types"] == tb.config_of(grouped)["layer_types"]
    per_expert = _per_expert_from(grouped, tmp_path / "per-expert")
    assert not open_target(per_expert).ignored
    build_target(per_expert, tmp_path / "from-per-expert", tokenizer_dir=tok)
    assert (tmp_path / "from-per-expert" / "openvino_model.bin").read_bytes() == want


def test_a_large_target_is_checked_on_a_probe_of_its_kinds(tmp_path, grouped, fixtures_dir, monkeypatch):
    """Above the compile budget the compiled-model check runs on a small model of the target's distinct
    layers: a linear and a full one, each with its experts."""
    from gguf2ov.targets import probe

    monkeypatch.setattr(probe, "COMPILE_BUDGET", 0)
    result = build_target(grouped, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    finding = {c.name: c for c in result.checks}["target-compiled"]
    assert finding.status == "pass" and finding.reason.startswith("6 GatherMatmul"), finding.reason
    assert "standing for layers 0, 3" in finding.reason, finding.reason


# --- bad input: one error line, no output folder --------------------------------------------------------

def _rewrite(src, dst, kv=None, tensors=None, drop=()):
    """A copy of a GGUF, in float32, with metadata and tensors changed (tensors: name -> float32 array)."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(src)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    arrays = {n: gguf.load(n) for n in gguf.tensors if n not in drop}
    write_gguf(dst, "qwen35moe", meta | (kv or {}), arrays | (tensors or {}))
    return dst


def _bad_inputs(tmp_path, checkpoint) -> dict:
    config = tb.config_of(checkpoint)

    def with_config(name, **changes):
        out = tmp_path / name
        out.mkdir()
        (out / "model.safetensors").symlink_to(checkpoint / "model.safetensors")
        (out / "config.json").write_text(json.dumps(config | changes))
        return out

    return {
        "GGUF: an expert count the tensors do not have": (
            _rewrite(LLAMACPP_FILE, tmp_path / "count.gguf", kv={"qwen35moe.expert_count": 6}),
            "wrong shapes: blk.0.ffn_down_exps.weight is [8, 32, 16], expected [6, 32, 16] for "
            "model.layers.0.mlp.experts.down_proj"),
        "GGUF: a top k above the expert count": (
            _rewrite(LLAMACPP_FILE, tmp_path / "top-k.gguf", kv={"qwen35moe.expert_used_count": 9}),
            "num_experts_per_tok is 9, above num_experts 8"),
        "GGUF: a shared expert width the tensors do not have": (
            _rewrite(LLAMACPP_FILE, tmp_path / "shared.gguf", kv={"qwen35moe.expert_shared_feed_forward_length": 24}),
            "blk.0.ffn_gate_shexp.weight is [16, 32], expected [24, 32]"),
        "GGUF: no shared expert gate": (
            _rewrite(LLAMACPP_FILE, tmp_path / "no-gate.gguf", drop=["blk.1.ffn_gate_inp_shexp.weight"]),
            "missing tensors: blk.1.ffn_gate_inp_shexp.weight"),
        "GGUF: the MTP block without its experts": (
            _rewrite(LLAMACPP_FILE, tmp_path / "mtp.gguf", drop=["blk.2.ffn_down_exps.weight"]),
            "the MTP block (block 2) lacks: blk.2.ffn_down_exps.weight"),
        "checkpoint: an expert count the tensors do not have": (
            with_config("count", num_experts=6),
            "shape mismatch (model.layers.0.mlp.experts.gate_up_proj (8, 32, 32) != (6, 32, 32)"),
        "checkpoint: a top k above the expert count": (
            with_config("top-k", num_experts_per_tok=9), "num_experts_per_tok is 9, above num_experts 8"),
        "VLM checkpoint: no text_config": (
            with_config("vlm", model_type="qwen3_5_moe"), "a qwen3_5_moe config without a text_config object"),
    }


BAD = ["GGUF: an expert count the tensors do not have", "GGUF: a top k above the expert count",
       "GGUF: a shared expert width the tensors do not have", "GGUF: no shared expert gate",
       "GGUF: the MTP block without its experts", "checkpoint: an expert count the tensors do not have",
       "checkpoint: a top k above the expert count", "VLM checkpoint: no text_config"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_error_line_and_no_folder(tmp_path, llamacpp_checkpoint, fixtures_dir, capsys, case):
    path, message = _bad_inputs(tmp_path, llamacpp_checkpoint)[case]
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(path), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and not any("Traceback" in line for line in err)
    assert len(err) == 1 or err[1].startswith("hint: ")
    assert message in err[0], err[0]
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


# --- in OpenVINO GenAI, with a DFlash draft attached ---------------------------------------------------

@pytest.mark.slow
def test_genai_runs_the_target_with_a_dflash_draft_attached(tmp_path, fixtures_dir):
    """A random DFlash draft (taps at layers 1 and 5, both linear-attention layers) attached to the target
    in GenAI's continuous-batching pipeline (the paged target: PagedGatedDeltaNet, GatherMatmul): the
    greedy text with the draft is the text of the target alone, on every fixture prompt. (An int8
    target parts on some prompts under the plugin's dynamic quantization of activations, whose verify
    pass over K + 1 tokens rounds unlike decoding, and agrees with it off: as a dense qwen35 target of
    the same geometry does; `accept` rechecks so.)"""
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.stages.accept import run_acceptance

    hf = tb.write_target_checkpoint(tmp_path / "hf", GROUPED, seed=7, vocab=512)  # the fixture tokenizer's
    result = build_target(hf, tmp_path / "target", tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks)
    tb.random_dflash_draft(tmp_path, GROUPED["hidden_size"], [1, 5])
    prompts = read_prompts(fixtures_dir / "prompts.txt")
    r = run_acceptance(TargetIR.open(tmp_path / "target"), tmp_path / "draft", prompts,
                       GenerationSettings(max_new_tokens=24, num_assistant_tokens=5, precision="f32"), progress=False)
    assert r.overall.identical, [p.first_difference for p in r.prompts]
