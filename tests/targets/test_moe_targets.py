"""Mixture-of-experts targets: `qwen3_moe` checkpoints and llama.cpp's `qwen3moe` GGUFs.

The block against transformers' own (Qwen3MoeSparseMoeBlock; Qwen3_5MoeSparseMoeBlock with its
shared expert), every weight form in the form OpenVINO's CPU plugin fuses into GatherMatmul (and
which of them stay compressed on the fused node), the layouts a source stores the experts in
(per expert, fused gate and up, in a checkpoint or on a GGUF's own grid), the GGUF writer read back
exactly, the compiled-model check (on the target, or on a probe of its kinds and forms), NNCF per
weight against the whole-model pass on optimum's export, and bad input.

The whole target against optimum-intel's export and transformers' forward over two stateful steps,
logits and every locator, is tests/targets/test_target_graph.py's (target_builders.GEOMETRIES holds two
qwen3_moe geometries: renormalised top 2, and top 3 of 6 not renormalised with a dense layer).
"""

import dataclasses
import json

import numpy as np
import pytest
import target_builders as tb
from ggufs import Q, decoder_kv, decoder_tensors

from gguf2ov.cli import main
from gguf2ov.ir.variants import parse_variant
from gguf2ov.ir.weights import save_ir
from gguf2ov.targets.graph import build_target_ir, target_forms
from opened import build_target, open_target

# hidden 256 and expert width 256: every GGUF block type applies (K-quants need 256-wide rows)
MOE = dict(model_type="qwen3_moe", hidden_size=256, intermediate_size=384, moe_intermediate_size=256, num_experts=8,
           num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
SMALL = tb.GEOMETRIES["qwen3moe-top2-untied"]
EXPERTS = ("gate_proj", "up_proj", "down_proj")


def _stacked(hf, i, name):
    """A checkpoint's per-expert weights of layer i stacked [E, N, K] (what the graph reads)."""
    from gguf2ov.hf.checkpoint import Checkpoint

    ckpt = Checkpoint(hf)
    prefix = f"model.layers.{i}.mlp.experts."
    keys = sorted((k for k in ckpt.shapes if k.startswith(prefix) and k.endswith(f".{name}.weight")),
                  key=lambda k: int(k[len(prefix):].split(".")[0]))
    return np.stack([ckpt.load(k) for k in keys])


@pytest.fixture(scope="module")
def moe_hf(tmp_path_factory):
    return tb.write_target_checkpoint(tmp_path_factory.mktemp("moe") / "hf", MOE, seed=4)


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory, moe_hf):
    """The writer's Q4_K_M of MOE: Q4_K experts, Q6_K ffn_down_exps in layer 2 (use_more_bits), Q8_0 attn_k/v and
    Q5_K attn_output (llama-quant's 8-expert rules), F32 routers."""
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    path = tmp_path_factory.mktemp("gguf") / "moe-Q4_K_M.gguf"
    write_from_checkpoint(moe_hf, path, "qwen3moe", mix="Q4_K_M", extra_metadata={"qwen3moe.vocab_size": tb.VOCAB})
    return path


# --- the block ---------------------------------------------------------------------------------------

def _block_ir(config, weights: dict, tmp_path):
    """The MoE kind's block of layer 0 alone, x [B, L, H] -> [B, L, H], saved."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.targets.layers import REGISTRY

    class Block:  # what a kind sees of the graph under construction: the config and its weights by name
        def __init__(self):
            self.config = config

        def weight(self, name):
            return ops.constant(np.ascontiguousarray(weights[name], np.float32)).output(0)

    x = ops.parameter([-1, -1, config.hidden_size], np.float32, name="x")
    model = ov.Model([ops.result(REGISTRY["moe"].build(Block(), x, 0))], [x], "block")
    ov.save_model(model, str(tmp_path / "block.xml"), compress_to_fp16=False)
    return tmp_path / "block.xml"


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_5_moe"])
def test_the_block_equals_transformers_sparse_moe_block(tmp_path, kind):
    """Qwen3MoeSparseMoeBlock with norm_topk_prob false (top 4 of 16); Qwen3_5MoeSparseMoeBlock (always
    renormalised) with its shared expert and sigmoid gate. Batch 2, f32; the compiled block runs 3
    GatherMatmul (the shared expert stays a FullyConnected)."""
    import torch
    from transformers import Qwen3_5MoeTextConfig, Qwen3MoeConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from gguf2ov.numerics import compile_exact
    from gguf2ov.targets.config import target_config

    common = dict(hidden_size=64, moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, num_hidden_layers=1)
    if kind == "qwen3_moe":
        hf = Qwen3MoeConfig(**common, norm_topk_prob=False, num_attention_heads=4)
        block = Qwen3MoeSparseMoeBlock(hf)
    else:
        hf = Qwen3_5MoeTextConfig(**common, shared_expert_intermediate_size=48, num_attention_heads=4,
                                  layer_types=["full_attention"])
        block = Qwen3_5MoeSparseMoeBlock(hf)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    state = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    inter = common["moe_intermediate_size"]
    p = "model.layers.0.mlp."
    gate_up = state["experts.gate_up_proj"]
    weights = {p + "gate.weight": state["gate.weight"], p + "experts.gate_proj": gate_up[:, :inter],
               p + "experts.up_proj": gate_up[:, inter:], p + "experts.down_proj": state["experts.down_proj"]}
    weights |= {p + k: v for k, v in state.items() if k.startswith("shared_expert")}
    # the kind reads the attention's fields from a resolved config and the MoE ones from transformers' config
    raw = {**tb.config_of(tb.write_target_checkpoint(tmp_path / "hf", SMALL)), "num_hidden_layers": 1}
    config = dataclasses.replace(target_config(raw, "block"), hf=hf, num_layers=1)
    xml = _block_ir(config, weights, tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32)
    with torch.no_grad():
        ref = block(torch.from_numpy(x)).numpy()
    out = compile_exact(xml)({"x": x})[0]
    assert tb.relative(out, ref) <= 1e-5
    kinds, _ = tb.runtime_kinds(xml)
    assert kinds["GatherMatmul"] == 3 and kinds["Tile"] == 0 and kinds["ScatterElementsUpdate"] == 0
    if kind == "qwen3_5_moe":
        assert kinds["FullyConnected"] == 5  # router, shared gate / up / down, shared expert gate


def test_a_swish_with_a_beta_input_leaves_the_block_dense(tmp_path, monkeypatch):
    """The trap the kind avoids: opset4.swish's beta input, and the plugin's rewrite does not match."""
    from openvino import opset4

    from gguf2ov.targets.layers import pieces

    hf = tb.write_target_checkpoint(tmp_path / "hf", SMALL)
    monkeypatch.setattr(pieces, "swish", lambda x: opset4.swish(x))  # the experts' (`pieces.expert_mlps`)
    forms = target_forms(open_target(hf), parse_variant("fp32"))
    (tmp_path / "ir").mkdir()
    save_ir(build_target_ir(forms), tmp_path / "ir", forms)
    kinds, _ = tb.runtime_kinds(tmp_path / "ir" / "openvino_model.xml")
    assert kinds["GatherMatmul"] == 0 and kinds["Tile"] == 2 and kinds["ScatterElementsUpdate"] == 2


# --- every weight form fuses; the compressed ones stay compressed on the fused node --------------------

@pytest.mark.slow
@pytest.mark.parametrize("weight_format, fused", [("fp32", {"f32"}), ("fp16", {"f32"}), ("int8", {"u8"}),
                                                  ("int4", {"u4"})])
def test_every_checkpoint_format_fuses(tmp_path, moe_hf, fixtures_dir, weight_format, fused):
    """3 GatherMatmul per layer, stateful and paged, nothing of the dense trace left; f16 experts are
    decompressed when compiled (no f16 GatherMatmul), NNCF's u8/u4 codes stay compressed. The command's
    own target-compiled check passes. f32 hint: the weights as the plugin holds them in f32 inference."""
    result = build_target(moe_hf, tmp_path / "t", weight_format=weight_format, tokenizer_dir=fixtures_dir / "target-hf")
    finding = {c.name: c for c in result.checks}["target-compiled"]
    assert finding.status == "pass" and finding.reason.startswith("9 GatherMatmul, no Tile or ScatterElementsUpdate")
    for paged in (False, True):
        kinds, weights = tb.runtime_kinds(tmp_path / "t" / "openvino_model.xml", paged, {"INFERENCE_PRECISION_HINT": "f32"})
        assert kinds["GatherMatmul"] == 9 and kinds["Tile"] == kinds["ScatterElementsUpdate"] == 0
        assert set(weights) == fused


def _expert_gguf(path, qtypes: dict, fused: bool = False, experts: int = 8, top_k: int = 2, inter: int = 256,
                 hidden: int = 256, layers: int = 2, router_shape=None, extra=None, drop=(), kv_extra=None,
                 given=None):
    """A qwen3moe GGUF written by hand as llama.cpp lays it out: `qtypes` {ffn_gate_exps / ffn_up_exps /
    ffn_down_exps / ffn_gate_up_exps: GGML type}, the experts random or `given` ({GGUF name: float32
    [E, N, K]}), every other tensor the same for the same arguments. Returns the experts' float32 values."""
    rng = np.random.default_rng(2)
    kv = decoder_kv("qwen3moe", layers=layers, hidden=hidden, heads=4, kv_heads=2, head_dim=64, vocab=tb.VOCAB) | {
        "qwen3moe.expert_count": experts, "qwen3moe.expert_used_count": top_k,
        "qwen3moe.expert_feed_forward_length": inter} | (kv_extra or {})
    tensors = decoder_tensors(rng, ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                                    "attn_k_norm"], layers=layers, hidden=hidden, heads=4, kv_heads=2, head_dim=64,
                              vocab=tb.VOCAB)
    for n in range(layers):
        tensors[f"blk.{n}.ffn_gate_inp.weight"] = rng.standard_normal(router_shape or (experts, hidden))
    made = {}
    for n in range(layers):
        shapes = {"ffn_down_exps": (experts, hidden, inter)}
        shapes |= {"ffn_gate_up_exps": (experts, 2 * inter, hidden)} if fused else \
            {"ffn_gate_exps": (experts, inter, hidden), "ffn_up_exps": (experts, inter, hidden)}
        for name, shape in shapes.items():
            key = f"blk.{n}.{name}.weight"
            values = (given or {}).get(key)
            made[key] = values if values is not None else (0.1 * rng.standard_normal(shape)).astype(np.float32)
            tensors[key] = (made[key], qtypes.get(name, Q.F32))
    for name in drop:
        del tensors[name]
    _write(path, kv, tensors | (extra or {}))
    return made


def _write(path, kv: dict, tensors: dict) -> None:
    """A GGUF of `tensors` (array, or (array, GGML type) quantized with gguf2ov's llama.cpp quantizers)."""
    from gguf import GGUFWriter

    from gguf2ov.gguf.quants import quantize
    from gguf2ov.tools.gguf_writer import add_value

    writer = GGUFWriter(path, "qwen3moe")
    for key, value in kv.items():
        add_value(writer, key, value)
    for name, value in tensors.items():
        array, qtype = value if isinstance(value, tuple) else (value, Q.F32)
        array = np.asarray(array, np.float32)
        if qtype == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(array))
        else:
            writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
@pytest.mark.parametrize("qtype, fused", [(Q.Q4_K, "u4"), (Q.Q6_K, "u8"), (Q.Q8_0, "i8"), (Q.Q5_K, "u8"),
                                          (Q.Q5_0, "u8"), (Q.Q4_0, "u4"), (Q.Q4_1, "u4"), (Q.MXFP4, "i8")],
                         ids=["Q4_K", "Q6_K", "Q8_0", "Q5_K", "Q5_0", "Q4_0", "Q4_1", "MXFP4"])
@pytest.mark.parametrize("grid", ["split", "compact"])
def test_every_gguf_grid_fuses_compressed(tmp_path, fixtures_dir, qtype, fused, grid):
    """Experts on the file's own grid, folded (as a target's default grid keeps experts) or compact:
    GatherMatmul on the codes
    (5- and 6-bit codes as u8), stateful and paged, and the values the file holds."""
    from gguf2ov.gguf.quants import dequantize, quantize

    path = tmp_path / "experts.gguf"
    made = _expert_gguf(path, dict.fromkeys(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), qtype))
    result = build_target(path, tmp_path / "t", grid=grid, tokenizer_dir=fixtures_dir / "target-hf")
    assert result.transcoded >= 6 and {c.name: c.status for c in result.checks}["target-compiled"] == "pass"
    for paged in (False, True):
        kinds, weights = tb.runtime_kinds(tmp_path / "t" / "openvino_model.xml", paged, {"INFERENCE_PRECISION_HINT": "f32"})
        assert kinds["GatherMatmul"] == 6 and kinds["Tile"] == kinds["ScatterElementsUpdate"] == 0
        assert set(weights) == {fused}
    source, name = open_target(path), "model.layers.1.mlp.experts.down_proj"
    want = dequantize(quantize(made["blk.1.ffn_down_exps.weight"], qtype), qtype).reshape(source.expected[name])
    np.testing.assert_array_equal(source.f32(name), want)
    # the weight as the IR computes it from the stored grid: the dequantized values, to float32 rounding
    got = _evaluated(tmp_path / "t" / "openvino_model.xml", "__module.model.layers.1.mlp.experts/aten::bmm/MatMul_2")
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def _evaluated(xml, matmul: str) -> np.ndarray:
    """The value of a MatMul's constant weight subgraph, computed by OpenVINO."""
    import openvino as ov

    model = ov.Core().read_model(str(xml))
    node = next(op for op in model.get_ordered_ops() if op.get_friendly_name() == matmul)
    sub = ov.Model([ov.opset13.result(node.input_value(1))], [], "weight")
    return ov.Core().compile_model(sub, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({})[0]


# --- the GGUF: values, the writer, the fused layout ------------------------------------------------------

def _transformers_on(source, hf):
    """transformers' model of `hf`'s config holding the source's values (experts fused in memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    state = {n: torch.from_numpy(np.array(source.f32(n))) for n in source.expected}
    for i in range(model.config.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        state[p + "gate_up_proj"] = torch.cat([state.pop(p + "gate_proj"), state.pop(p + "up_proj")], 1)
    assert not model.load_state_dict(state, strict=False).missing_keys
    return model


def test_a_q4_k_m_target_computes_transformers_on_the_files_values(tmp_path, q4_k_m, moe_hf, fixtures_dir):
    """Two stateful steps, logits and every locator, against transformers holding the file's dequantized
    weights; the writer's mix as llama-quant makes it for 8 experts."""
    import torch

    from gguf2ov.gguf.read import open_gguf

    types = {n: t.qtype.name for n, t in open_gguf(q4_k_m).tensors.items()}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_up_exps.weight"] == "Q4_K"
    assert (types["blk.0.ffn_down_exps.weight"], types["blk.2.ffn_down_exps.weight"]) == ("Q4_K", "Q6_K")
    assert (types["blk.0.attn_k.weight"], types["blk.0.attn_v.weight"], types["blk.0.attn_output.weight"]) == \
        ("Q8_0", "Q8_0", "Q5_K")
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    result = build_target(q4_k_m, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    assert result.weight_format == "gguf" and result.transcoded == 3 * 7 + 2  # every 2-D and 3-D weight but routers
    assert all(c.status == "pass" for c in result.checks)
    source = open_target(q4_k_m)
    model = _transformers_on(source, moe_hf)
    steps = tb.steps(tb.VOCAB)
    with torch.no_grad():
        ref = model(torch.tensor(np.concatenate(steps))[None], output_hidden_states=True)
    xml = tmp_path / "t" / "openvino_model.xml"
    runs = tb.run_steps(xml, steps, tb.locators(xml), properties={"KV_CACHE_PRECISION": "f32"})
    assert tb.relative(np.concatenate([r[0] for r in runs], axis=1), ref.logits.numpy()) <= 1e-5
    for i in runs[0][1]:
        hidden = np.concatenate([r[1][i] for r in runs], axis=1)
        assert tb.relative(hidden, ref.hidden_states[i + 1].numpy()) <= 1e-5, f"layer {i}"


def test_a_gguf_written_by_the_writer_reads_back_exactly(tmp_path, moe_hf):
    """The checkpoint's per-expert weights stacked as llama.cpp's converter stacks them: ggml ne {K, N, E},
    read back as the graph's [E, N, K], bit for bit (F32); the metadata gives the config back."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.hf.checkpoint import Checkpoint
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    path = tmp_path / "f32.gguf"
    result = write_from_checkpoint(moe_hf, path, "qwen3moe", mix="F32",
                                   extra_metadata={"qwen3moe.vocab_size": tb.VOCAB})
    gguf = open_gguf(path)
    assert gguf.tensors["blk.0.ffn_gate_exps.weight"].ne == (256, 256, 8)  # {K, N, E}
    assert gguf.metadata["qwen3moe.expert_count"] == 8 and gguf.metadata["qwen3moe.expert_used_count"] == 2
    assert gguf.metadata["qwen3moe.expert_feed_forward_length"] == 256
    assert result.n_tensors == 3 + 3 * 12  # embedding, norm, head; per layer 8 of attention, the router, 3 experts
    source, ckpt = open_target(path), Checkpoint(moe_hf)
    assert source.config.hf.num_experts == 8 and source.config.hf.norm_topk_prob is True
    for name in source.expected:
        if ".experts." in name:
            i, proj = int(name.split(".")[2]), name.rsplit(".", 1)[1]
            np.testing.assert_array_equal(source.f32(name), _stacked(moe_hf, i, proj), err_msg=name)
        else:
            np.testing.assert_array_equal(source.f32(name), ckpt.load(name), err_msg=name)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=["Q8_0", "Q4_K"])
def test_a_fused_gate_up_is_read_on_its_own_grid(tmp_path, fixtures_dir, qtype):
    """ffn_gate_up_exps [E, 2I, H]: gate the first I rows, up the rest, each handed out as the rows' own
    blocks (nothing requantized); the target equals the one from the same values written apart."""
    from gguf2ov.gguf.quants import dequantize, quantize

    fused_path, split_path = tmp_path / "fused.gguf", tmp_path / "split.gguf"
    made = _expert_gguf(fused_path, {"ffn_gate_up_exps": qtype, "ffn_down_exps": qtype}, fused=True)
    source = open_target(fused_path)
    inter = 256
    for n in range(2):
        fused = made[f"blk.{n}.ffn_gate_up_exps.weight"]
        raw = quantize(fused, qtype)
        for name, rows in (("gate_proj", slice(0, inter)), ("up_proj", slice(inter, 2 * inter))):
            canonical = f"model.layers.{n}.mlp.experts.{name}"
            stored, stored_type = source.quantized(canonical)
            assert stored_type == qtype
            np.testing.assert_array_equal(stored(), raw[:, rows])
            np.testing.assert_array_equal(source.f32(canonical), dequantize(raw, qtype).reshape(fused.shape)[:, rows])
    # the same values apart: the halves' blocks are the fused tensor's (blocks run along K), so the two
    # targets hold the same constants
    split = {}
    for n in range(2):
        fused = made[f"blk.{n}.ffn_gate_up_exps.weight"]
        split |= {f"blk.{n}.ffn_gate_exps.weight": fused[:, :inter], f"blk.{n}.ffn_up_exps.weight": fused[:, inter:],
                  f"blk.{n}.ffn_down_exps.weight": made[f"blk.{n}.ffn_down_exps.weight"]}
    _expert_gguf(split_path, dict.fromkeys(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), qtype), given=split)
    tok = ["--tokenizer", str(fixtures_dir / "target-hf"), "--quiet"]
    for path, out in ((fused_path, "a"), (split_path, "b")):
        assert main(["target", str(path), "-o", str(tmp_path / out), *tok]) == 0
    assert json.loads((tmp_path / "a" / "gguf2ov.json").read_text())["options"]["transcoded"] == 2 * 3  # the experts
    a, b = (tb.run_steps(tmp_path / out / "openvino_model.xml", tb.steps(tb.VOCAB)) for out in "ab")
    for (logits_a, _), (logits_b, _) in zip(a, b):
        np.testing.assert_array_equal(logits_a, logits_b)


def test_a_checkpoint_with_fused_experts_builds_the_same_target(tmp_path, fixtures_dir):
    """A checkpoint whose experts are the in-memory 3-D parameters (`experts.gate_up_proj` [E, 2I, H],
    `experts.down_proj` [E, H, I], what save_pretrained writes for qwen3_5_moe) gives the same IR
    constants as the per-expert keys qwen3_moe's save_pretrained writes."""
    from safetensors.numpy import save_file

    from gguf2ov.hf.checkpoint import Checkpoint

    per_expert = tb.write_target_checkpoint(tmp_path / "per-expert", SMALL, seed=6)
    ckpt, fused = Checkpoint(per_expert), tmp_path / "fused"
    fused.mkdir()
    state = {k: ckpt.load(k) for k in ckpt.shapes if ".experts." not in k}
    for i in range(SMALL["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        state[p + "gate_up_proj"] = np.concatenate([_stacked(per_expert, i, "gate_proj"),
                                                    _stacked(per_expert, i, "up_proj")], axis=1)
        state[p + "down_proj"] = _stacked(per_expert, i, "down_proj")
    save_file(state, str(fused / "model.safetensors"))
    (fused / "config.json").write_text((per_expert / "config.json").read_text())
    outs = []
    for hf in (per_expert, fused):
        source = open_target(hf)
        assert not source.ignored
        forms = target_forms(source, parse_variant("fp32"))
        (hf / "ir").mkdir()
        save_ir(build_target_ir(forms), hf / "ir", forms)
        outs.append(tb.run_steps(hf / "ir" / "openvino_model.xml", tb.steps(tb.VOCAB)))
    for (a, _), (b, _) in zip(*outs):
        np.testing.assert_array_equal(a, b)


# --- the compiled-model check ----------------------------------------------------------------------------

def test_a_large_target_is_checked_on_a_probe_of_its_kinds_and_forms(tmp_path, q4_k_m, fixtures_dir, monkeypatch):
    """Above the compile budget, the check compiles a small model of the target's distinct layers
    (layer 0, and layer 2 whose ffn_down_exps is Q6_K), with the same kinds, GGUF types and experts."""
    from gguf2ov.targets import probe

    monkeypatch.setattr(probe, "COMPILE_BUDGET", 0)
    result = build_target(q4_k_m, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf")
    finding = {c.name: c for c in result.checks}["target-compiled"]
    assert finding.status == "pass", finding.reason
    assert finding.reason.startswith("6 GatherMatmul, no Tile or ScatterElementsUpdate, stateful and paged "
                                     "(fused weights: 5 u4, 1 u8)")
    assert "checked on a 2-layer model of the target's layer kinds and weight forms (standing for layers 0, 2" in \
        finding.reason
    source = open_target(q4_k_m)
    forms = target_forms(source, parse_variant("gguf"))
    assert probe.distinct_layers(source, forms) == [0, 2]


def test_a_block_the_plugin_leaves_dense_fails_the_check(tmp_path, fixtures_dir, monkeypatch, capsys):
    """The check bites: a Swish with a beta input keeps the dense trace, and the command stops, in one
    error line, before the folder is put in place."""
    from openvino import opset4

    from gguf2ov.targets.layers import pieces

    hf = tb.write_target_checkpoint(tmp_path / "hf", SMALL)
    monkeypatch.setattr(pieces, "swish", lambda x: opset4.swish(x))  # the experts' (`pieces.expert_mlps`)
    out = tmp_path / "out"
    assert main(["target", str(hf), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "target-compiled: stateful: 0 GatherMatmul (expected 6), 2 Tile (expected 0), " \
        "2 ScatterElementsUpdate (expected 0); paged: 0 GatherMatmul (expected 6)" in err[0]
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


# --- bad input: one error line, no output folder -----------------------------------------------------------

def _checkpoint_with(tmp_path, name, config=None, drop=(), replace=None):
    """SMALL's checkpoint with config.json keys changed, tensors dropped or replaced."""
    from safetensors.numpy import save_file

    from gguf2ov.hf.checkpoint import Checkpoint

    hf = tb.write_target_checkpoint(tmp_path / f"{name}-src", SMALL)
    ckpt, out = Checkpoint(hf), tmp_path / name
    out.mkdir()
    state = {k: ckpt.load(k) for k in ckpt.shapes if not any(k.startswith(d) for d in drop)} | (replace or {})
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(tb.config_of(hf) | (config or {})))
    return out


def _moe_bad_inputs(tmp_path):
    small = dict(experts=4, inter=32, hidden=64)
    gguf = {
        "an expert count the tensors do not have": (
            dict(small, kv_extra={"qwen3moe.expert_count": 6}),
            "wrong shapes: blk.0.ffn_gate_inp.weight is [4, 64], expected [6, 64] for model.layers.0.mlp.gate.weight"),
        "a top k above the expert count": (
            dict(small, kv_extra={"qwen3moe.expert_used_count": 5}),
            "num_experts_per_tok is 5, above num_experts 4"),
        "a router of another shape": (
            dict(small, router_shape=(4, 32)), "blk.0.ffn_gate_inp.weight is [4, 32], expected [4, 64]"),
        "a shared expert's router, which qwen3moe has not": (
            dict(small, extra={"blk.0.ffn_gate_inp_shexp.weight": np.zeros((1, 64), np.float32)}),
            "tensors the map does not know: blk.0.ffn_gate_inp_shexp.weight"),
        "no router": (dict(small, drop=("blk.1.ffn_gate_inp.weight",)), "missing tensors: blk.1.ffn_gate_inp.weight"),
        "a fused gate_up of the wrong shape": (
            dict(small, fused=True, extra={"blk.1.ffn_gate_up_exps.weight": np.zeros((4, 48, 64), np.float32)}),
            "blk.1.ffn_gate_up_exps.weight is [4, 48, 64], expected [4, 64, 64] for "
            "model.layers.1.mlp.experts.gate_up_proj"),
        "gate and up both apart and fused": (
            dict(small, extra={f"blk.{n}.ffn_gate_up_exps.weight": np.zeros((4, 64, 64), np.float32) for n in (0, 1)}),
            "2 unexpected (model.layers.0.mlp.experts.gate_up_proj, model.layers.1.mlp.experts.gate_up_proj)"),
    }
    cases = {}
    for case, (kwargs, message) in gguf.items():
        path = tmp_path / f"{len(cases)}.gguf"
        _expert_gguf(path, {}, **kwargs)
        cases["GGUF: " + case] = ([str(path)], message)
    e = SMALL["num_experts"]
    checkpoints = {
        "an expert count the tensors do not have": (
            dict(config={"num_local_experts": e - 2}), "12 unexpected (model.layers.0.mlp.experts.6.down_proj.weight"),
        "an expert missing": (
            dict(drop=("model.layers.1.mlp.experts.7.",)),
            "3 missing (model.layers.1.mlp.experts.down_proj, model.layers.1.mlp.experts.gate_proj, "
            "model.layers.1.mlp.experts.up_proj); 21 unexpected"),
        "a top k above the expert count": (dict(config={"num_experts_per_tok": e + 1}),
                                           f"num_experts_per_tok is {e + 1}, above num_experts {e}"),
        "a fused gate_up of the wrong shape": (
            dict(drop=("model.layers.0.mlp.experts.",),
                 replace={"model.layers.0.mlp.experts.gate_up_proj": np.zeros((e, 48, 64), np.float32),
                          "model.layers.0.mlp.experts.down_proj": np.zeros((e, 64, 32), np.float32)}),
            "shape mismatch (model.layers.0.mlp.experts.gate_up_proj (8, 48, 64) != (8, 64, 64))"),
    }
    for case, (kwargs, message) in checkpoints.items():
        hf = _checkpoint_with(tmp_path, f"ckpt{len(cases)}", **kwargs)
        cases["checkpoint: " + case] = ([str(hf)], message)
    return cases


MOE_BAD = ["GGUF: an expert count the tensors do not have", "GGUF: a top k above the expert count",
           "GGUF: a router of another shape", "GGUF: a shared expert's router, which qwen3moe has not",
           "GGUF: no router",
           "GGUF: a fused gate_up of the wrong shape", "GGUF: gate and up both apart and fused",
           "checkpoint: an expert count the tensors do not have", "checkpoint: an expert missing",
           "checkpoint: a top k above the expert count", "checkpoint: a fused gate_up of the wrong shape"]


@pytest.mark.parametrize("case", MOE_BAD)
def test_bad_moe_input_is_one_error_line_and_no_folder(tmp_path, fixtures_dir, capsys, case):
    args, message = _moe_bad_inputs(tmp_path)[case]
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", *args, "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and not any("Traceback" in line for line in err)
    assert message in err[0], err[0]
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


# --- NNCF: equal to whole-model compress_weights on optimum's export ---------------------------------------

@pytest.fixture(scope="module")
def optimum_moe(tmp_path_factory):
    """optimum's float32 export of a qwen3_moe with widths 128 (group 128 divides them), 16 experts."""
    work = tmp_path_factory.mktemp("nncf-moe")
    geometry = SMALL | {"hidden_size": 128, "moe_intermediate_size": 128, "intermediate_size": 192, "num_experts": 16,
                        "head_dim": 32}
    hf = tb.write_target_checkpoint(work / "hf", geometry, seed=2)
    return hf, tb.optimum_export(hf, work / "ov")


def _signatures(model) -> dict:
    from gguf2ov.ir.nncf_weights import decompression_signature

    out = {}
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        if name.endswith("aten::linear/MatMul") or "aten::bmm/MatMul" in name:
            out[name] = decompression_signature(op.input_value(1), with_data=True)
        elif name.endswith("aten::embedding/Gather"):
            out[name] = decompression_signature(op.input_value(0), with_data=True)
    return out


def _ignored_scope(xml) -> str:
    text = xml.read_text()
    return text[text.index("<ignored_scope"):text.index("</ignored_scope>")]


@pytest.mark.slow
@pytest.mark.parametrize("variant_name", ["int8", "int4_asym_g128", "int4_sym_g32_r0.8", "int4_asym_g32_all"])
def test_streamed_nncf_equals_whole_model_nncf_with_the_routers_ignored(tmp_path, optimum_moe, variant_name,
                                                                       monkeypatch):
    """Bit for bit, experts compressed in chunks of whole experts: every Linear, expert and the embedding,
    against nncf.compress_weights on optimum's export with the routers' MatMuls in an ignored scope
    (which our rt_info records as that run does); the routers stay float32 Constants."""
    import nncf
    import openvino as ov

    from gguf2ov.ir import nncf_weights

    monkeypatch.setattr(nncf_weights, "CHUNK_ELEMENTS", 4 * 128 * 128)  # several chunks of 8 experts
    hf, ov_dir = optimum_moe
    variant = parse_variant(variant_name)
    forms = target_forms(open_target(hf), variant)
    (tmp_path / "ours").mkdir()
    save_ir(build_target_ir(forms), tmp_path / "ours", forms)
    routers = [f"__module.model.layers.{i}.mlp.gate/aten::linear/MatMul" for i in range(SMALL["num_hidden_layers"])]
    mode = f"INT{variant.bits}_{'SYM' if variant.sym else 'ASYM'}"
    kwargs = {"mode": getattr(nncf.CompressWeightsMode, mode), "ignored_scope": nncf.IgnoredScope(names=routers)}
    if variant.bits == 4:
        kwargs.update(group_size=variant.group_size, ratio=variant.ratio or 1.0)
        if variant.all_layers:
            kwargs["all_layers"] = True
    whole = nncf.compress_weights(ov.Core().read_model(str(ov_dir / "openvino_model.xml")), **kwargs)
    ov.save_model(whole, str(tmp_path / "whole.xml"), compress_to_fp16=False)
    ours = ov.Core().read_model(str(tmp_path / "ours" / "openvino_model.xml"))
    a, b = _signatures(ours), _signatures(ov.Core().read_model(str(tmp_path / "whole.xml")))
    assert a.keys() == b.keys() and a == b
    for router in routers:
        assert a[router][0][0] == "Constant" and a[router][0][1] == "f32"
    assert _ignored_scope(tmp_path / "ours" / "openvino_model.xml") == _ignored_scope(tmp_path / "whole.xml")
