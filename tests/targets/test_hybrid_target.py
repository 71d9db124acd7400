"""Hybrid targets (Qwen3.5 / 3.6 / 3.8: Gated DeltaNet "linear attention" layers beside gated full
attention), from a `qwen3_5_text` checkpoint, the text model of a `qwen3_5` VLM checkpoint and a `qwen35`
GGUF in llama.cpp's layout.

Held to transformers 5.5.4's own forward (logits and every locator over two stateful steps, float32);
to OpenVINO's fusions (one GatedDeltaNet per linear layer in the stateful CPU runtime model; after the
paged conversion GenAI runs when a draft attaches, one PagedGatedDeltaNet and one PagedCausalConv1D
per linear layer, a paged attention per full layer and no state op left); and to llama.cpp's layout,
with fewer key than value heads so that the tiled value heads are exercised. Bad files are one error
line and no output folder.
"""

import json

import numpy as np
import pytest
import target_builders as tb
from ggufs import write_gguf

from gguf2ov.cli import main
from gguf2ov.errors import Gguf2ovError
from opened import build_target, open_target

HYBRID = {
    # fewer key than value heads and dk != dv, so that a wrong head order or a swapped state shows;
    # layers L L L F L L L F; untied head
    "grouped": dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
                    linear_conv_kernel_dim=4, tie_word_embeddings=False),
    # a tied head (the small Qwen3.5s'), as many key as value heads, half of each head rotated, every
    # second layer full attention, a conv kernel of 3
    "tied-half-rotary": dict(model_type="qwen3_5_text", hidden_size=48, intermediate_size=64, num_hidden_layers=4,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=24, linear_num_key_heads=3,
                             linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=8,
                             linear_conv_kernel_dim=3, tie_word_embeddings=True, partial_rotary_factor=0.5,
                             full_attention_interval=2),
}
GROUPED = HYBRID["grouped"]


@pytest.fixture(scope="module", params=list(HYBRID))
def hybrid(request, tmp_path_factory):
    """(checkpoint folder, our fp32 IR) of one geometry."""
    work = tmp_path_factory.mktemp(request.param)
    hf = tb.write_target_checkpoint(work / "hf", HYBRID[request.param], seed=3)
    return hf, tb.target_ir(hf, work / "ours")


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    work = tmp_path_factory.mktemp("grouped")
    return tb.write_target_checkpoint(work / "hf", GROUPED, seed=5)


def _transformers(hf, state=None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    if state is not None:  # the weights a GGUF holds
        model.load_state_dict({n: torch.from_numpy(np.array(v)) for n, v in state.items()}, strict=False)
    return model


# --- the graph against transformers; the fusions -----------------------------------------------------

def test_logits_and_every_locator_equal_transformers_over_two_stateful_steps(hybrid):
    """Within 1e-4 relative, as the other targets against transformers (measured: 6.9e-6 and 8.8e-6
    for the grouped geometry, 2.3e-6 and 3.0e-6 for the tied one): a random model can amplify float32
    rounding in its linear layers (with dv 12, 5e-5, where a mixer fed the same input was 8e-6 from
    transformers' in float64: a token's gated norm of a small output)."""
    hf, xml = hybrid
    config = tb.config_of(hf)
    worst = tb.worst_against_transformers(xml, _transformers(hf))
    assert set(worst) == {"logits", *range(config["num_hidden_layers"])}  # linear layers have locators too
    assert max(worst.values()) <= 1e-4, worst


def test_openvino_fuses_every_linear_layer_and_pages_every_state(hybrid):
    """Stateful: the CPU plugin runs one GatedDeltaNet per linear layer (the Loop fused) and its conv.
    Paged (what GenAI makes of the target when a draft attaches): PagedGatedDeltaNet and
    PagedCausalConv1D per linear layer with their state tables, a paged attention per full layer, no
    ReadValue/Assign left (DFlash refuses unmanaged state) and every locator still there."""
    from collections import Counter

    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    from gguf2ov.numerics import compile_exact
    from gguf2ov.targets.checks import target_findings

    hf, xml = hybrid
    c = open_target(hf).config
    linear, full = c.layer_types.count("linear_attention"), c.layer_types.count("full_attention")
    runtime = Counter(op.get_rt_info()["layerType"].astype(str)
                      for op in compile_exact(xml).get_runtime_model().get_ops())
    assert (runtime["GatedDeltaNet"], runtime["Convolution"], runtime["ScaledDotProductAttention"]) == (linear, linear,
                                                                                                      full)
    assert runtime["Loop"] == 0
    model = ov.Core().read_model(str(xml))
    assert {f.name: f.status for f in target_findings(model, c)} == dict.fromkeys(
        ["target-inputs", "target-logits", "target-state", "target-locators", "target-embedding", "target-head",
         "target-paged", "target-positions"], "pass")
    states = {v.get_info().variable_id: str(v.get_info().data_shape) for v in model.get_variables()}
    hf_config = c.hf
    nk, nv = hf_config.linear_num_key_heads, hf_config.linear_num_value_heads
    dk, dv, k = hf_config.linear_key_head_dim, hf_config.linear_value_head_dim, hf_config.linear_conv_kernel_dim
    conv = 2 * nk * dk + nv * dv
    assert states["cache_params.past.conv.0cache_params.present.conv.0"] == f"[?,{conv},{k}]"
    assert states["cache_params.past.ssm.0cache_params.present.ssm.0"] == f"[?,{nv},{dk},{dv}]"
    assert states["cache_params.past.key.0cache_params.present.key.0"] == f"[?,{c.num_kv_heads},?,{c.head_dim}]"
    assert len(states) == 2 * c.num_layers
    paged_attention_transformation(model)
    ops = Counter(op.get_type_name() for op in model.get_ops())
    assert (ops["PagedGatedDeltaNet"], ops["PagedCausalConv1D"], ops["PagedAttentionExtension"]) == (linear, linear, full)
    assert ops["ReadValue"] == ops["Assign"] == 0
    inputs = {p.get_any_name(): str(p.get_partial_shape()) for p in model.inputs}
    assert inputs["gated_delta_state_table.0"] == f"[?,{nv},{dv},{dk}]" and inputs["conv_state_table.0"] == f"[?,{conv},{k}]"
    assert {"position_ids", "la.block_indices", "la.block_indices_begins", "la.past_lens", "la.cache_interval"} <= set(inputs)


def test_the_key_heads_repeat_in_grouped_order(hybrid):
    """Value head j reads key head j // r, as transformers' repeat_interleave. Once fused, the kernel
    groups so whatever the graph's repeat says (FuseGroupedQueryIntoGDN drops the repeat unread), so a
    comparison with transformers cannot see a wrong order there: the repeat itself is checked, and a
    GGUF's tiled value heads are un-tiled in the weights (the map), never in the graph."""
    import openvino as ov

    hf, xml = hybrid
    c = tb.config_of(hf)
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    repeats = [op for op in ov.Core().read_model(str(xml)).get_ordered_ops()
               if op.get_type_name() == "Gather" and "/aten::repeat_interleave/" in op.get_friendly_name()]
    layers = c["layer_types"].count("linear_attention")
    assert len(repeats) == (2 * layers if nk != nv else 0)
    for op in repeats:
        np.testing.assert_array_equal(op.input_value(1).get_node().get_data(), np.repeat(np.arange(nk), nv // nk))


# --- llama.cpp's layout --------------------------------------------------------------------------------

def llama_cpp_reorder_v_heads(tensor, dim: int, num_k_heads: int, num_v_per_k: int, head_dim: int):
    """llama.cpp's converter (conversion/qwen.py, _LinearAttentionVReorderBase._reorder_v_heads): HF's
    grouped value heads to ggml's tiled order along `dim`, as it writes a qwen35 GGUF."""
    shape = list(tensor.shape)
    new_shape = shape[:dim] + [num_k_heads, num_v_per_k, head_dim] + shape[dim + 1:]
    tensor = tensor.reshape(*new_shape)
    perm = list(range(len(new_shape)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return tensor.permute(*perm).contiguous().reshape(*shape)


def _write_qwen35(hf, path, mix="F32"):
    from gguf2ov.tools.gguf_writer import write_gguf as write_from_checkpoint

    write_from_checkpoint(hf, path, "qwen35", mix=mix, extra_metadata={"qwen35.vocab_size": tb.VOCAB})
    return path


def test_a_gguf_in_llama_cpp_layout_reads_back_exactly(tmp_path, grouped):
    """The writer runs the map backwards: the file holds what llama.cpp's converter writes (norms + 1,
    ssm_a = -exp(A_log), the tiled value heads in attn_qkv, ssm_conv1d, attn_gate, ssm_alpha/beta,
    ssm_a, ssm_dt and ssm_out's columns, the squeezed conv kernel), and reads back as the checkpoint."""
    import torch

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.hf.checkpoint import Checkpoint

    path = _write_qwen35(grouped, tmp_path / "q.gguf")
    gguf, ck = open_gguf(path), Checkpoint(grouped)
    meta = gguf.metadata
    assert (meta["qwen35.ssm.group_count"], meta["qwen35.ssm.time_step_rank"], meta["qwen35.ssm.state_size"],
            meta["qwen35.ssm.inner_size"], meta["qwen35.rope.dimension_count"]) == (2, 4, 8, 64, 4)
    assert list(meta["qwen35.attention.recurrent_layers"]) == [True, True, True, False] * 2
    nk, nv, dk, dv = 2, 4, 8, 16
    p = "model.language_model.layers.0.linear_attn."

    def hf(name):
        return torch.from_numpy(ck.load(p + name))

    def tiled(name, dim=0, size=dv, after=0):
        x = hf(name).squeeze(1) if name == "conv1d.weight" else hf(name)
        head, tail = x.split([after, x.shape[dim] - after], dim) if dim == 0 else (x[:, :0], x)
        return torch.cat([head, llama_cpp_reorder_v_heads(tail, dim, nk, nv // nk, size)], dim).numpy()

    expected = {"attn_qkv.weight": tiled("in_proj_qkv.weight", after=2 * nk * dk),
                "ssm_conv1d.weight": tiled("conv1d.weight", after=2 * nk * dk),
                "attn_gate.weight": tiled("in_proj_z.weight"), "ssm_beta.weight": tiled("in_proj_b.weight", size=1),
                "ssm_alpha.weight": tiled("in_proj_a.weight", size=1), "ssm_dt.bias": tiled("dt_bias", size=1),
                "ssm_out.weight": tiled("out_proj.weight", dim=1)}
    for name, values in expected.items():
        np.testing.assert_array_equal(gguf.load(f"blk.0.{name}"), values, err_msg=name)
    np.testing.assert_allclose(gguf.load("blk.0.ssm_a"), -np.exp(tiled("A_log", size=1)), rtol=1e-6)
    np.testing.assert_allclose(gguf.load("blk.3.attn_q_norm.weight"),
                               ck.load("model.language_model.layers.3.self_attn.q_norm.weight") + 1, rtol=1e-6)
    source = open_target(path)
    assert source.config.layer_types == tuple(tb.config_of(grouped)["layer_types"])
    for name in source.expected:
        stored = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        np.testing.assert_allclose(source.f32(name), ck.load(stored), rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_a_target_from_the_gguf_computes_the_checkpoints_model(tmp_path, grouped):
    path = _write_qwen35(grouped, tmp_path / "q.gguf")
    worst = tb.worst_against_transformers(tb.target_ir(path, tmp_path / "ours"), _transformers(grouped))
    assert max(worst.values()) <= 1e-4, worst


# --- formats -----------------------------------------------------------------------------------------

def _weight_types(xml) -> dict[str, str]:
    """{MatMul name: element type of the constant its weight is stored in}."""
    import openvino as ov

    from gguf2ov.ir.irweights import weight_constants

    model = ov.Core().read_model(str(xml))
    out = {name: src.get_output_element_type(0).get_type_name() for name, src in weight_constants(model).items()}
    assert out
    return out


@pytest.mark.slow
@pytest.mark.parametrize("weight_format", ["fp16", "int8", "int4"])
def test_every_nncf_and_float_format_from_the_checkpoint(tmp_path, grouped, fixtures_dir, weight_format):
    """int4 keeps the Gated DeltaNet projections in int8 (int4 corrupts them) and says so."""
    result = build_target(grouped, tmp_path / "t", weight_format=weight_format, tokenizer_dir=fixtures_dir / "target-hf",
                          group_size=16 if weight_format == "int4" else None)
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    types = _weight_types(tmp_path / "t" / "openvino_model.xml")
    gdn = {n: t for n, t in types.items() if ".linear_attn." in n}
    mlp = {n: t for n, t in types.items() if ".mlp." in n}
    assert len(gdn) == 6 * 5
    if weight_format == "int4":
        assert set(gdn.values()) == {"u8"} and set(mlp.values()) == {"u4"}
        kept = [n for n, why in result.nncf_backup_why.items() if why.startswith("Gated DeltaNet")]
        assert len(kept) == 30 and "30 Gated DeltaNet projections (int4 makes" in "\n".join(result.summary())
    else:
        assert set(gdn.values()) == set(mlp.values()) == {"f16" if weight_format == "fp16" else "u8"}


@pytest.mark.slow
@pytest.mark.parametrize("grid", ["split", "compact"])
def test_the_gguf_grid_computes_the_files_model(tmp_path, grouped, fixtures_dir, grid):
    """A Q8_0 file's grid carried by every weight, ssm_out's too: its blocks span the tiled value heads
    along its columns, so the grid keeps the file's order and the product takes its inputs in that
    order. The target computes the dequantized model transformers runs from the same weights."""
    import openvino as ov

    path = _write_qwen35(grouped, tmp_path / "q.gguf", mix="Q8_0")
    result = build_target(path, tmp_path / "t", tokenizer_dir=fixtures_dir / "target-hf", grid=grid)
    assert all(c.status == "pass" for c in result.checks)
    source = open_target(path)
    assert result.transcoded == sum(len(shape) == 2 for shape in source.expected.values())
    xml = tmp_path / "t" / "openvino_model.xml"
    worst = tb.worst_against_transformers(xml, _transformers(grouped, {n: source.f32(n) for n in source.expected}))
    assert max(worst.values()) <= 1e-4, worst
    gdn = {n: t for n, t in _weight_types(xml).items() if ".linear_attn." in n}
    assert len(gdn) == 30 and set(gdn.values()) <= {"i8", "u8"}
    out_proj = next(op for op in ov.Core().read_model(str(xml)).get_ops()
                    if op.get_friendly_name() == "__module.model.layers.0.linear_attn.out_proj/aten::linear/MatMul")
    reorder = out_proj.input_value(0).get_node()
    assert reorder.get_type_name() == "Gather"  # the inputs in the file's column order
    nk, nv, dv = 2, 4, 16
    np.testing.assert_array_equal(reorder.input_value(1).get_node().get_data(),
                                  np.arange(nv * dv).reshape(nk, nv // nk, dv).transpose(1, 0, 2).reshape(-1))


# --- checkpoints -------------------------------------------------------------------------------------

def test_the_text_model_of_a_vlm_checkpoint(tmp_path, grouped, fixtures_dir):
    """The hub ships Qwen3_5ForConditionalGeneration: a qwen3_5 config with a text_config, the language
    model under model.language_model., a vision tower and an MTP block. The target is the language
    model alone, config.json its text config; the same IR as from the text checkpoint."""
    from safetensors.numpy import load_file, save_file

    vlm = tmp_path / "vlm"
    vlm.mkdir()
    text = tb.config_of(grouped)
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": {k: v for k, v in text.items() if k not in ("architectures", "tie_word_embeddings")},
              "vision_config": {"depth": 1, "hidden_size": 16}, "tie_word_embeddings": False}
    (vlm / "config.json").write_text(json.dumps(config))
    state = load_file(str(grouped / "model.safetensors"))
    state["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((48, 16), np.float32)
    state["mtp.fc.weight"] = np.zeros((64, 128), np.float32)
    save_file(state, str(vlm / "model.safetensors"))
    tok = fixtures_dir / "target-hf"
    build_target(vlm, tmp_path / "from-vlm", tokenizer_dir=tok)
    build_target(grouped, tmp_path / "from-text", tokenizer_dir=tok)
    assert (tmp_path / "from-vlm" / "openvino_model.bin").read_bytes() == \
        (tmp_path / "from-text" / "openvino_model.bin").read_bytes()
    written = json.loads((tmp_path / "from-vlm" / "config.json").read_text())
    assert written["model_type"] == "qwen3_5_text" and written["architectures"] == ["Qwen3_5ForCausalLM"]
    assert written["layer_types"] == text["layer_types"] and written["tie_word_embeddings"] is False


# --- GGUF variants and bad files ---------------------------------------------------------------------

def _rewrite(src, dst, kv=None, drop_kv=(), tensors=None, drop=()):
    """A copy of a float GGUF with metadata and tensors changed (tensors: name -> float32 array)."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(src)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture" and k not in drop_kv}
    arrays = {n: gguf.load(n) for n in gguf.tensors if n not in drop}
    write_gguf(dst, "qwen35", meta | (kv or {}), arrays | (tensors or {}))
    return dst


@pytest.fixture(scope="module")
def qwen35_gguf(tmp_path_factory, grouped):
    return _write_qwen35(grouped, tmp_path_factory.mktemp("gguf") / "q.gguf")


def _mtp_block(gguf_path, n: int) -> dict:
    """The MTP block llama.cpp writes after the decoder's: a full-attention block and its nextn tensors."""
    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(gguf_path)
    block = {name.replace("blk.3.", f"blk.{n}."): gguf.load(name) for name in gguf.tensors if name.startswith("blk.3.")}
    h = gguf.metadata["qwen35.embedding_length"]
    rng = np.random.default_rng(0)
    block |= {f"blk.{n}.nextn.eh_proj.weight": rng.standard_normal((h, 2 * h)).astype(np.float32),
              f"blk.{n}.nextn.enorm.weight": np.ones(h, np.float32), f"blk.{n}.nextn.hnorm.weight": np.ones(h, np.float32),
              f"blk.{n}.nextn.shared_head_norm.weight": np.ones(h, np.float32)}
    return block


def test_an_mtp_block_is_accepted_and_dropped(tmp_path, qwen35_gguf):
    layers = GROUPED["num_hidden_layers"]
    path = _rewrite(qwen35_gguf, tmp_path / "mtp.gguf", tensors=_mtp_block(qwen35_gguf, layers),
                    kv={"qwen35.block_count": layers + 1, "qwen35.nextn_predict_layers": 1,
                        "qwen35.attention.recurrent_layers": [True, True, True, False] * 2 + [False]})
    with_mtp, without = open_target(path), open_target(qwen35_gguf)
    assert with_mtp.config.num_layers == layers and with_mtp.config.raw["mtp_num_hidden_layers"] == 1
    assert with_mtp.expected == without.expected
    for name in without.expected:
        np.testing.assert_array_equal(with_mtp.f32(name), without.f32(name), err_msg=name)


def test_ollama_style_variants_are_read(tmp_path, qwen35_gguf):
    """ssm_dt without .bias, three rope sections, head counts per layer (0 KV heads in a linear layer)."""
    per_layer = [0, 0, 0, 2] * 2
    kv = {"qwen35.rope.dimension_sections": [11, 11, 10], "qwen35.attention.head_count_kv": per_layer,
          "qwen35.attention.head_count": [4] * 8}
    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(qwen35_gguf)
    renamed = {n[:-len(".bias")]: gguf.load(n) for n in gguf.tensors if n.endswith("ssm_dt.bias")}
    path = _rewrite(qwen35_gguf, tmp_path / "ollama.gguf", kv=kv, tensors=renamed, drop=[n + ".bias" for n in renamed])
    ollama, plain = open_target(path), open_target(qwen35_gguf)
    assert (ollama.config.num_heads, ollama.config.num_kv_heads) == (4, 2)
    assert ollama.expected == plain.expected
    for name in plain.expected:
        np.testing.assert_array_equal(ollama.f32(name), plain.f32(name), err_msg=name)


def test_without_recurrent_layers_every_interval_th_layer_is_full_attention(tmp_path, qwen35_gguf):
    """PyPI's gguf 0.19.0 writes no attention.recurrent_layers: then llama.cpp's loader (and
    transformers' config) take every full_attention_interval-th layer as full attention."""
    path = _rewrite(qwen35_gguf, tmp_path / "interval.gguf", drop_kv=["qwen35.attention.recurrent_layers"])
    assert open_target(path).config.layer_types == open_target(qwen35_gguf).config.layer_types
    path = _rewrite(qwen35_gguf, tmp_path / "two.gguf", kv={"qwen35.full_attention_interval": 2},
                    drop_kv=["qwen35.attention.recurrent_layers"])
    with pytest.raises(Gguf2ovError, match=r"blk\.1\.attn_qkv\.weight: in a full_attention layer"):
        open_target(path)  # layer 1 is now full attention, and holds a linear layer's tensors


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and not any(line.startswith("Traceback") for line in err)
    assert len(err) == 1 or err[1].startswith("hint: ")
    return err[0]


def _bad_files(tmp_path, qwen35_gguf) -> dict:
    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(qwen35_gguf)
    layers = GROUPED["num_hidden_layers"]
    fused = {}
    for n in (3, 7):  # llama.cpp's --fuse-qkv: the full layers' Q, K and V in one attn_qkv
        fused[f"blk.{n}.attn_qkv.weight"] = np.concatenate([gguf.load(f"blk.{n}.attn_{x}.weight") for x in "qkv"])
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(qwen35_gguf.read_bytes()[:-300])
    return {
        "a fused attn_qkv in a full layer": (
            _rewrite(qwen35_gguf, tmp_path / "fused.gguf", tensors=fused,
                     drop=[f"blk.{n}.attn_{x}.weight" for n in (3, 7) for x in "qkv"]),
            "blk.3.attn_qkv.weight: in a full_attention layer, attn_qkv is llama.cpp's --fuse-qkv layout"),
        "an MTP count without its block": (
            _rewrite(qwen35_gguf, tmp_path / "mtp-count.gguf", kv={"qwen35.nextn_predict_layers": 1}),
            "qwen35.nextn_predict_layers is 1, but the MTP block (block 7) lacks: blk.7.nextn.eh_proj.weight"),
        "more MTP blocks counted than written": (
            _rewrite(qwen35_gguf, tmp_path / "mtp-two.gguf", tensors=_mtp_block(qwen35_gguf, layers),
                     kv={"qwen35.block_count": layers + 2, "qwen35.nextn_predict_layers": 2}),
            "the MTP block (block 8..9) lacks: blk.9."),
        "per-layer head counts that differ": (
            _rewrite(qwen35_gguf, tmp_path / "heads.gguf", kv={"qwen35.attention.head_count_kv": [0, 0, 0, 2, 0, 0, 0, 1]}),
            "qwen35.attention.head_count_kv states num_key_value_heads per layer ([0, 0, 0, 2, 0, 0, 0, 1]), with 2 "
            "different values"),
        "value heads that do not divide into key heads": (
            _rewrite(qwen35_gguf, tmp_path / "inner.gguf", kv={"qwen35.ssm.inner_size": 50}),
            "qwen35.ssm.inner_size = 50 is not a multiple of linear_num_value_heads = 4"),
        "a truncated file": (truncated, "corrupt or truncated"),
    }


@pytest.mark.parametrize("case", ["a fused attn_qkv in a full layer", "an MTP count without its block",
                                  "more MTP blocks counted than written", "per-layer head counts that differ",
                                  "value heads that do not divide into key heads", "a truncated file"])
def test_bad_qwen35_files_are_one_error_line_and_no_folder(tmp_path, qwen35_gguf, fixtures_dir, capsys, case):
    path, message = _bad_files(tmp_path, qwen35_gguf)[case]
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(path), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    assert message in _one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


def test_a_map_op_on_the_wrong_geometry_is_an_error(qwen35_gguf):
    from gguf2ov.maps.rules import apply_ops

    with pytest.raises(Gguf2ovError, match="untile_heads: axis 0 of"):
        apply_ops((("untile_heads", {"groups": 2, "heads": 4, "size": 3}),), np.zeros((10, 2)), {})


# --- a file llama.cpp's own converter wrote -----------------------------------------------------------

def test_a_file_llama_cpps_converter_wrote_reads_as_its_checkpoint(tmp_path):
    """tests/data/qwen35-mtp-llamacpp-F16.gguf: convert_hf_to_gguf.py (llama.cpp 0c1e570) of
    qwen35_data's checkpoint, MTP block included, 2 key / 4 value heads (benchmarks/llamacpp/qwen35.py).
    Every tensor reads back as the checkpoint's (the file holds them in float16 exactly; the norms'
    + 1 and ssm_a = -exp(A_log) are llama.cpp's float32 arithmetic), the MTP block is dropped, and
    the target computes transformers' model of the checkpoint."""
    import qwen35_data

    from gguf2ov.hf.checkpoint import Checkpoint

    hf = qwen35_data.write_checkpoint(tmp_path / "hf")
    source = open_target(qwen35_data.LLAMACPP_FILE)
    c = source.config
    assert (c.num_layers, c.layer_types, c.raw["mtp_num_hidden_layers"]) == (2, ("linear_attention", "full_attention"), 1)
    assert (c.hf.linear_num_key_heads, c.hf.linear_num_value_heads, c.hf.linear_value_head_dim) == (2, 4, 8)
    checkpoint = Checkpoint(hf)
    exact = 0
    for name in source.expected:
        stored = "model.language_model." + name[len("model."):]
        ref = checkpoint.load(stored)
        np.testing.assert_allclose(source.f32(name), ref, rtol=1e-6, atol=1e-7, err_msg=name)
        exact += bool(np.array_equal(source.f32(name), ref))
    assert exact >= len(source.expected) - 8  # 7 norms + 1 and A_log
    worst = tb.worst_against_transformers(tb.target_ir(qwen35_data.LLAMACPP_FILE, tmp_path / "ours"), _transformers(hf))
    assert max(worst.values()) <= 1e-4, worst
