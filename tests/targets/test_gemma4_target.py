"""Gemma 4 dense text targets (`gemma4_text`, llama.cpp's `gemma4`): sliding and global layers with their
own head sizes, RoPE bases and (global, attention_k_eq_v) key/value heads and no v_proj, proportional
RoPE on the global layers, shared-KV layers that read an earlier layer's keys and values, q/k/v norms,
four norms per layer scaling by w, each layer's output scale, attention scale 1.0, scaled embedding and
final logit softcapping.

Held to transformers 5.5.4's Gemma4ForCausalLM (logits and every locator over two stateful steps,
float32); to what OpenVINO's paged conversion (GenAI's, when a draft attaches) makes of it: one paged
attention per layer with its own heads, head size and window, a shared-KV layer's over the cache of the
layer it shares; and to GenAI running it with a DFlash draft attached. Per-layer embeddings are refused in one
line (the mixture of experts beside the MLP: test_gemma4_moe_target.py).
"""

import json
from collections import Counter

import numpy as np
import pytest
import target_builders as tb

from gguf2ov.cli import main
from gguf2ov.runtime.target import TargetIR
from opened import build_target, open_target

LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
GEMMA4 = {
    # 31B-like: global layers with a head twice the sliding layers', one key/value head and no v_proj
    # (attention_k_eq_v); the last two layers (one sliding, one global) share the keys and values of layers
    # 1 and 2; a window of 4 under the 7-token first step; tied head
    "shared-kv": dict(model_type="gemma4_text", hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                      attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
                      layer_types=LAYERS, sliding_window=4, final_logit_softcapping=30.0,
                      hidden_size_per_layer_input=0),
    # every layer its own keys and values, v_proj everywhere, half of each global head turned at other RoPE
    # bases, untied head, no softcap
    "own-kv-untied": dict(model_type="gemma4_text", hidden_size=48, intermediate_size=64, num_hidden_layers=4,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=24,
                          layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=3,
                          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                           "full_attention": {"rope_type": "proportional", "rope_theta": 20000.0,
                                                              "partial_rotary_factor": 0.5}},
                          hidden_size_per_layer_input=0, tie_word_embeddings=False),
    # E2B/E4B-like: per-layer embeddings (8 values a layer), every layer with v_proj, the last three layers
    # (two sliding, one global) sharing the keys and values of layers 1 and 2; a window of 4; tied head
    "per-layer-embeddings": dict(model_type="gemma4_text", hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 global_head_dim=32, num_kv_shared_layers=3, layer_types=LAYERS[:3] + LAYERS[:3],
                                 sliding_window=4, final_logit_softcapping=30.0, hidden_size_per_layer_input=8,
                                 vocab_size_per_layer_input=tb.VOCAB),
}
# E2B-like: the per-layer-embeddings geometry with the MLPs of its three shared-KV layers twice as wide
GEMMA4["e2b"] = dict(GEMMA4["per-layer-embeddings"], use_double_wide_mlp=True)
SHARED = GEMMA4["shared-kv"]
PLE = GEMMA4["per-layer-embeddings"]


@pytest.fixture(scope="module", params=list(GEMMA4))
def gemma4(request, tmp_path_factory):
    """(checkpoint folder, our fp32 IR) of one geometry."""
    work = tmp_path_factory.mktemp(request.param)
    hf = tb.write_target_checkpoint(work / "hf", GEMMA4[request.param], seed=3)
    return hf, tb.target_ir(hf, work / "ours")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tb.write_target_checkpoint(tmp_path_factory.mktemp("shared") / "hf", SHARED, seed=5)


def _transformers(hf):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)


def test_logits_and_every_locator_equal_transformers_over_two_stateful_steps(gemma4):
    """Within 1e-5 relative (measured: 3.0e-6 at most, a locator of the shared-KV geometry; its logits 2.3e-6;
    1.0e-6 for the other geometry)."""
    hf, xml = gemma4
    worst = tb.worst_against_transformers(xml, _transformers(hf))
    assert set(worst) == {"logits", *range(tb.config_of(hf)["num_hidden_layers"])}
    assert max(worst.values()) <= 1e-5, worst


def test_each_layer_keeps_its_own_geometry_and_shared_layers_keep_no_state(gemma4):
    """A K and a V state per layer with keys and values of its own, shaped by its type's heads; none for a
    shared layer. The global layers' RoPE turns partial_rotary_factor of the head and passes the rest
    (a proportional table: zeros past the turned frequencies)."""
    import openvino as ov

    hf, xml = gemma4
    config = tb.config_of(hf)
    c = open_target(hf).config
    states = {v.get_info().variable_id: str(v.get_info().data_shape)
              for v in ov.Core().read_model(str(xml)).get_variables()}
    shared_from = c.num_layers - config.get("num_kv_shared_layers", 0)
    expected = {}
    for i, layer_type in enumerate(config["layer_types"]):
        if i >= shared_from:
            continue
        glob = layer_type == "full_attention"
        kv = config["num_global_key_value_heads"] if glob and config.get("attention_k_eq_v") else \
            config["num_key_value_heads"]
        size = config["global_head_dim"] if glob else config["head_dim"]
        for kind in ("key", "value"):
            expected[f"past_key_values.{i}.{kind}present.{i}.{kind}"] = f"[?,{kv},?,{size}]"
    assert states == expected
    inv_freq, _ = c.rope["full_attention"]
    turned = int(c.hf.rope_parameters["full_attention"]["partial_rotary_factor"] * config["global_head_dim"] // 2)
    assert inv_freq.size == config["global_head_dim"] // 2
    assert np.all(inv_freq[:turned] > 0) and not np.any(inv_freq[turned:])


def test_the_paged_conversion_keeps_windows_head_sizes_and_shared_caches(gemma4):
    """What GenAI makes of the target when a draft attaches: one paged attention per layer, scale 1.0,
    the sliding layers' window and each type's heads; a shared layer's paged attention reads the key and
    value caches of the layer it shares (and writes the same keys and values there), so there is one
    cache per layer with keys and values of its own; no state op left (the `target-paged` check)."""
    from gguf2ov.targets.checks import target_findings

    hf, xml = gemma4
    config = tb.config_of(hf)
    c = open_target(hf).config
    import openvino as ov

    findings = {f.name: f for f in target_findings(ov.Core().read_model(str(xml)), c)}
    assert all(f.status == "pass" for f in findings.values()), [(f.name, f.reason) for f in findings.values()]
    paged = tb.paged_summary(xml)
    own = c.num_layers - config.get("num_kv_shared_layers", 0)
    caches = Counter(name.split(".")[0] for name, _, _ in paged["inputs"] if name.startswith(("key_cache.",
                                                                                               "value_cache.")))
    assert caches == {"key_cache": own, "value_cache": own}
    expected = []
    for layer_type in config["layer_types"]:
        glob = layer_type == "full_attention"
        kv = config["num_global_key_value_heads"] if glob and config.get("attention_k_eq_v") else \
            config["num_key_value_heads"]
        size = config["global_head_dim"] if glob else config["head_dim"]
        expected.append(([1.0], [0 if glob else config["sliding_window"]], [kv, size, kv, size]))
    assert paged["attention"] == expected
    if own < c.num_layers:
        assert "of them over an earlier layer's key/value cache (shared KV)" in findings["target-paged"].reason


def test_the_text_model_of_a_vlm_checkpoint(tmp_path, shared, fixtures_dir):
    """The hub ships Gemma4ForConditionalGeneration: a gemma4 config with a text_config, the language model
    under model.language_model., vision and audio towers beside it. The target is the language model
    alone, config.json its text config; the same IR as from the text checkpoint."""
    from safetensors.numpy import load_file, save_file

    vlm = tmp_path / "vlm"
    vlm.mkdir()
    text = tb.config_of(shared)
    config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
              "text_config": {k: v for k, v in text.items() if k != "architectures"},
              "vision_config": {"hidden_size": 16}, "tie_word_embeddings": True}
    (vlm / "config.json").write_text(json.dumps(config))
    state = {k.replace("model.", "model.language_model.", 1): v
             for k, v in load_file(str(shared / "model.safetensors")).items()}
    state["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = np.zeros((32, 16), np.float32)
    state["model.embed_vision.embedding_projection.weight"] = np.zeros((64, 16), np.float32)
    save_file(state, str(vlm / "model.safetensors"))
    tok = fixtures_dir / "target-hf"
    build_target(vlm, tmp_path / "from-vlm", tokenizer_dir=tok)
    build_target(shared, tmp_path / "from-text", tokenizer_dir=tok)
    assert (tmp_path / "from-vlm" / "openvino_model.bin").read_bytes() == \
        (tmp_path / "from-text" / "openvino_model.bin").read_bytes()
    written = json.loads((tmp_path / "from-vlm" / "config.json").read_text())
    assert written["model_type"] == "gemma4_text" and written["architectures"] == ["Gemma4ForCausalLM"]


@pytest.mark.slow
@pytest.mark.parametrize("weight_format", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("geometry", ["shared-kv", "per-layer-embeddings"])
def test_every_float_and_nncf_format_from_the_checkpoint(tmp_path, fixtures_dir, weight_format, geometry):
    """The command's every format of the shared-KV geometries: its checks all pass (the paged conversion
    among them, the shared layers over their donors' caches; the token embedding GenAI picks, not the
    per-layer table)."""
    hf = tb.write_target_checkpoint(tmp_path / "hf", GEMMA4[geometry], seed=5)
    group = min(16, GEMMA4[geometry].get("hidden_size_per_layer_input") or 16)  # a group divides every input width
    result = build_target(hf, tmp_path / "t", weight_format=weight_format, tokenizer_dir=fixtures_dir / "target-hf",
                          group_size=group if weight_format == "int4" else None)
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    paged = next(c for c in result.checks if c.name == "target-paged")
    shared = GEMMA4[geometry]["num_kv_shared_layers"]
    assert f"{shared} of them over an earlier layer's key/value cache (shared KV)" in paged.reason


# --- llama.cpp's layout, as the project's writer writes it ---------------------------------------------

def _write_gemma4(hf, path, mix="F32"):
    from gguf2ov.tools.gguf_writer import write_gguf

    write_gguf(hf, path, "gemma4", mix=mix, extra_metadata={"gemma4.vocab_size": tb.VOCAB})
    return path


def test_a_gguf_in_llama_cpps_layout_builds_the_checkpoints_target(tmp_path, gemma4):
    """The writer runs the map backwards as llama.cpp's converter writes a gemma4 file: head sizes as
    key_length_swa and key_length, RoPE bases as freq_base_swa and freq_base, the key/value heads per
    layer where the global layers have their own, no attn_v in the global layers of an attention_k_eq_v
    model, no K or V in the shared layers, the global layers' proportional RoPE as rope_freqs (1 for each
    turned frequency, 1e30 for the others). The target built from it is the checkpoint's, byte for byte."""
    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    hf, xml = gemma4
    config = tb.config_of(hf)
    path = _write_gemma4(hf, tmp_path / "g.gguf")
    gguf = open_gguf(path)
    meta = gguf.metadata
    glob = config["rope_parameters"]["full_attention"] if "rope_parameters" in config else {}
    assert (meta["gemma4.attention.key_length_swa"], meta["gemma4.attention.key_length"]) == \
        (config["head_dim"], config["global_head_dim"])
    assert list(meta["gemma4.attention.sliding_window_pattern"]) == [t == "sliding_attention"
                                                                      for t in config["layer_types"]]
    turned = int(glob["partial_rotary_factor"] * config["global_head_dim"] // 2)
    np.testing.assert_array_equal(gguf.load("rope_freqs.weight"),
                                  np.float32([1.0] * turned + [1e30] * (config["global_head_dim"] // 2 - turned)))
    shared_from = config["num_hidden_layers"] - config.get("num_kv_shared_layers", 0)
    wide = 2 if config.get("use_double_wide_mlp") else 1
    widths = [config["intermediate_size"] * (wide if n >= shared_from else 1) for n in range(config["num_hidden_layers"])]
    assert plain_value(meta["gemma4.feed_forward_length"]) == (widths if wide == 2 else widths[0])
    for n, layer_type in enumerate(config["layer_types"]):
        own = n < shared_from
        assert (f"blk.{n}.attn_k.weight" in gguf.tensors) == own
        assert (f"blk.{n}.attn_v.weight" in gguf.tensors) == (own and not (
            layer_type == "full_attention" and config.get("attention_k_eq_v")))
    ours = tb.target_ir(path, tmp_path / "from-gguf")
    assert ours.with_suffix(".bin").read_bytes() == xml.with_suffix(".bin").read_bytes()
    c, reference = open_target(path).config, open_target(hf).config
    assert (c.layer_types, c.head_dims, c.num_kv_heads) == (reference.layer_types, reference.head_dims,
                                                           reference.num_kv_heads)
    for key in ("attention_k_eq_v", "num_kv_shared_layers", "sliding_window", "final_logit_softcapping",
                "intermediate_size", "use_double_wide_mlp"):
        assert getattr(c.hf, key) == getattr(reference.hf, key), key


def _rewrite(src, dst, kv=None, tensors=None, drop=()):
    """A copy of a float gemma4 GGUF with metadata and tensors changed (tensors: name -> float32 array)."""
    from ggufs import write_gguf

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    gguf = open_gguf(src)
    meta = {k: plain_value(v) for k, v in gguf.metadata.items() if k != "general.architecture"}
    arrays = {n: gguf.load(n) for n in gguf.tensors if n not in drop}
    write_gguf(dst, "gemma4", meta | (kv or {}), arrays | (tensors or {}))
    return dst


def _bad_files(tmp_path, gguf_path) -> dict:
    return {
        "per-layer embeddings without their layers' tensors": (
            _rewrite(gguf_path, tmp_path / "ple.gguf", kv={"gemma4.embedding_length_per_layer_input": 8},
                     tensors={"per_layer_token_embd.weight": np.zeros((tb.VOCAB, 8 * 5), np.float32)}),
            "tensors do not match the gemma4 model its config describes: 17 missing (model.layers.0.per_layer_input_gate"),
        "MLP widths per layer other than E2B's double-wide shared-KV layers": (
            _rewrite(gguf_path, tmp_path / "wide.gguf", kv={"gemma4.feed_forward_length": [96, 96, 192, 192, 192]}),
            "gemma4.feed_forward_length states intermediate_size per layer ([96, 96, 192, 192, 192]), where this map "
            "reads one value for every layer, or 2 times it in the last num_kv_shared_layers (2) layers"),
        "rope_freqs for another head size": (
            _rewrite(gguf_path, tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": np.ones(8, np.float32)}),
            "rope_freqs.weight holds 8 factors for the 16 RoPE frequencies of the full_attention layers"),
        "key/value heads that differ among sliding layers": (
            _rewrite(gguf_path, tmp_path / "heads.gguf", kv={"gemma4.attention.head_count_kv": [2, 1, 1, 2, 1]}),
            "gemma4.attention.head_count_kv states num_key_value_heads per layer ([2, 1, 1, 2, 1]), with 2 "
            "different values in its sliding_attention layers"),
    }


@pytest.mark.parametrize("case", ["per-layer embeddings without their layers' tensors",
                                  "MLP widths per layer other than E2B's double-wide shared-KV layers",
                                  "rope_freqs for another head size",
                                  "key/value heads that differ among sliding layers"])
def test_bad_gemma4_files_are_one_error_line_and_no_folder(tmp_path, shared, fixtures_dir, capsys, case):
    path, message = _bad_files(tmp_path, _write_gemma4(shared, tmp_path / "g.gguf"))[case]
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(path), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


# --- a file llama.cpp's own converter wrote, and llama.cpp's greedy text on it ---------------------------

def test_a_file_llama_cpps_converter_wrote_builds_the_checkpoints_target(tmp_path):
    """tests/data/gemma4-llamacpp-F32.gguf: convert_hf_to_gguf.py (llama.cpp 0c1e570) of gemma4_data's
    checkpoint (benchmarks/llamacpp/gemma4.py). It reads back as the checkpoint (its config too: the
    per-layer key/value heads, attention_k_eq_v from the global layers' missing attn_v, the proportional
    RoPE from rope_freqs), the target built from it is the checkpoint's byte for byte, and that computes
    transformers' model of the checkpoint."""
    import gemma4_data

    hf = gemma4_data.write_checkpoint(tmp_path / "hf")
    source, reference = open_target(gemma4_data.LLAMACPP_FILE), open_target(hf)
    c = source.config
    assert c.layer_types == reference.config.layer_types
    assert c.head_dims == {"sliding_attention": 16, "full_attention": 32}
    assert (c.num_kv_heads, c.hf.num_global_key_value_heads, c.hf.attention_k_eq_v, c.hf.num_kv_shared_layers) == \
        (2, 1, True, 2)
    assert source.expected == reference.expected
    for name in source.expected:
        np.testing.assert_array_equal(source.f32(name), reference.f32(name), err_msg=name)
    ours = tb.target_ir(gemma4_data.LLAMACPP_FILE, tmp_path / "from-gguf")
    from_hf = tb.target_ir(hf, tmp_path / "from-hf")
    assert ours.with_suffix(".bin").read_bytes() == from_hf.with_suffix(".bin").read_bytes()
    worst = tb.worst_against_transformers(ours, _transformers(hf))
    assert max(worst.values()) <= 1e-5, worst


def test_the_target_of_llama_cpps_file_generates_llama_cpps_greedy_text(tmp_path):
    """On llama-tokenize's ids of each prompt, the target built from the file llama.cpp's converter wrote
    continues greedily as llama-simple did on that file (recorded by benchmarks/llamacpp/gemma4.py: CI
    has no llama.cpp), the tokens read through the file's own vocabulary."""
    import gemma4_data

    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(gemma4_data.LLAMACPP_FILE)
    recorded = gemma4_data.llamacpp_greedy()
    xml = tb.target_ir(gemma4_data.LLAMACPP_FILE, tmp_path / "ours")
    ours = gemma4_data.greedy_texts(xml, gguf, recorded)
    assert ours == [p["text"] for p in recorded["prompts"]]


def test_a_per_layer_embeddings_file_llama_cpps_converter_wrote_builds_the_checkpoints_target(tmp_path):
    """tests/data/gemma4-ple-llamacpp-F32.gguf: convert_hf_to_gguf.py (llama.cpp 0c1e570) of gemma4_data's
    per-layer-embeddings checkpoint (`benchmarks/llamacpp/gemma4.py ple`). It reads back as the checkpoint
    (hidden_size_per_layer_input from embedding_length_per_layer_input, the per-layer table's rows the
    vocabulary's), the target built from it is the checkpoint's byte for byte, and that computes transformers'
    model of the checkpoint."""
    import gemma4_data

    hf = gemma4_data.write_checkpoint(tmp_path / "hf", gemma4_data.PLE_CONFIG)
    source, reference = open_target(gemma4_data.LLAMACPP_PLE_FILE), open_target(hf)
    c = source.config
    assert (c.hf.hidden_size_per_layer_input, c.hf.vocab_size_per_layer_input, c.hf.num_kv_shared_layers,
            c.hf.attention_k_eq_v) == (8, 384, 2, False)
    assert source.expected == reference.expected
    assert "model.embed_tokens_per_layer.weight" in source.embeddings
    for name in source.expected:
        np.testing.assert_array_equal(source.f32(name), reference.f32(name), err_msg=name)
    ours = tb.target_ir(gemma4_data.LLAMACPP_PLE_FILE, tmp_path / "from-gguf")
    from_hf = tb.target_ir(hf, tmp_path / "from-hf")
    assert ours.with_suffix(".bin").read_bytes() == from_hf.with_suffix(".bin").read_bytes()
    worst = tb.worst_against_transformers(ours, _transformers(hf))
    assert max(worst.values()) <= 1e-5, worst


@pytest.mark.parametrize("kind", ["PLE", "E2B"])
def test_the_target_of_llama_cpps_per_layer_embeddings_file_generates_llama_cpps_greedy_text(tmp_path, kind):
    """As for the dense file: on llama-tokenize's ids of each prompt, the target built from the per-layer-
    embeddings file (and from the E2B file, with its double-wide MLPs) continues greedily as llama-simple did on
    that file (recorded: CI has no llama.cpp), on every prompt but where the target's top two logits came within
    1e-3 of each other: llama.cpp computes GELU through a float16 table (ggml-cpu vec.h GGML_GELU_FP16), which
    moves them by that much. Measured: PLE 4 of 5 prompts the same, the fifth leaving llama-simple's text at a
    step whose top two logits are 0.0000 apart; E2B 5 of 5."""
    import gemma4_data

    from gguf2ov.gguf.read import open_gguf

    path = getattr(gemma4_data, f"LLAMACPP_{kind}_FILE")
    gguf = open_gguf(path)
    recorded = gemma4_data.llamacpp_greedy(getattr(gemma4_data, f"LLAMACPP_{kind}_GREEDY"))
    xml = tb.target_ir(path, tmp_path / "ours")
    eos = int(gguf.metadata["tokenizer.ggml.eos_token_id"])
    same = 0
    for p in recorded["prompts"]:
        margins = []
        ours = gemma4_data.pieces_text(gguf, gemma4_data.greedy_ids(xml, p["ids"], recorded["new_tokens"], eos, margins))
        same += ours == p["text"]
        assert ours == p["text"] or min(margins) < 1e-3, (p["prompt"], ours, p["text"], min(margins))
    assert same >= 4


def test_an_e2b_file_llama_cpps_converter_wrote_builds_the_checkpoints_target(tmp_path):
    """tests/data/gemma4-e2b-llamacpp-F32.gguf: convert_hf_to_gguf.py (llama.cpp 0c1e570) of gemma4_data's E2B-like
    checkpoint (`benchmarks/llamacpp/gemma4.py --e2b`: per-layer embeddings, shared KV and the double-wide MLPs of
    the shared-KV layers). The converter writes feed_forward_length per layer ([64, 64, 128, 128]); it reads
    back as intermediate_size 64 with use_double_wide_mlp, the target built from it is the checkpoint's byte for
    byte, and that computes transformers' model of the checkpoint."""
    import gemma4_data

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.maps.rules import plain_value

    assert plain_value(open_gguf(gemma4_data.LLAMACPP_E2B_FILE).metadata["gemma4.feed_forward_length"]) == \
        [64, 64, 128, 128]
    hf = gemma4_data.write_checkpoint(tmp_path / "hf", gemma4_data.E2B_CONFIG)
    source, reference = open_target(gemma4_data.LLAMACPP_E2B_FILE), open_target(hf)
    c = source.config
    assert (c.intermediate_size, c.hf.use_double_wide_mlp, c.hf.num_kv_shared_layers,
            c.hf.hidden_size_per_layer_input) == (64, True, 2, 8)
    assert source.expected == reference.expected
    assert source.expected["model.layers.3.mlp.down_proj.weight"] == (48, 128)
    for name in source.expected:
        np.testing.assert_array_equal(source.f32(name), reference.f32(name), err_msg=name)
    ours = tb.target_ir(gemma4_data.LLAMACPP_E2B_FILE, tmp_path / "from-gguf")
    from_hf = tb.target_ir(hf, tmp_path / "from-hf")
    assert ours.with_suffix(".bin").read_bytes() == from_hf.with_suffix(".bin").read_bytes()
    worst = tb.worst_against_transformers(ours, _transformers(hf))
    assert max(worst.values()) <= 1e-5, worst


def test_the_fixture_vlms_language_model_computes_the_vlm_on_text(tmp_path, fixtures_dir):
    """fixtures/tiny-vlm/target-hf, the Gemma4ForConditionalGeneration checkpoint whose optimum export the
    VLM fixture runs: its target (the language model alone) is transformers' VLM on text tokens, logits
    and every locator over two stateful steps (measured: 9.3e-7 at most)."""
    import torch
    from transformers import AutoModelForImageTextToText

    hf = fixtures_dir.parent / "tiny-vlm" / "target-hf"
    xml = tb.target_ir(hf, tmp_path / "ours")
    vlm = AutoModelForImageTextToText.from_pretrained(str(hf), dtype=torch.float32)
    worst = tb.worst_against_transformers(xml, vlm, vocab=tb.config_of(hf)["text_config"]["vocab_size"])
    assert set(worst) == {"logits", *range(tb.config_of(hf)["text_config"]["num_hidden_layers"])}
    assert max(worst.values()) <= 1e-5, worst


def test_the_target_of_llama_quantizes_file_in_its_own_grid_generates_llama_cpps_text_on_most_prompts(tmp_path):
    """tests/data/gemma4-llamacpp-Q4_K_M.gguf, llama-quantize's of the converter's file (Q5_0 and Q8_0:
    rows of 64 are too narrow for K-quants), built in the file's own grid: its greedy continuation is
    llama-simple's on most prompts (measured: 3 of 5). Not on all: llama.cpp quantizes the activations to
    8 bits for these types, the target computes them in float32, and this random model's top logits are
    close enough for that to pick another token."""
    import gemma4_data

    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(gemma4_data.LLAMACPP_Q4_K_M)
    recorded = gemma4_data.llamacpp_greedy()
    xml = tb.target_ir(gemma4_data.LLAMACPP_Q4_K_M, tmp_path / "ours", variant="gguf")
    ours = gemma4_data.greedy_texts(xml, gguf, recorded)
    same = [a == p["text_Q4_K_M"] for a, p in zip(ours, recorded["prompts"])]
    assert sum(same) > len(same) / 2, (same, ours)


def test_the_files_own_tokenizer_gives_llama_cpps_ids():
    """A gemma4 vocabulary (SentencePiece-style BPE: spaces as U+2581, no space prefix, the file's merges,
    byte fallback, bos always first) built from the file's metadata, as the HF tokenizer and as the
    OpenVINO tokenizer the target folder carries: llama-tokenize's ids on every recorded prompt."""
    import gemma4_data
    import openvino as ov

    from gguf2ov.gguf.read import open_gguf
    from gguf2ov.gguf.tokenizer import hf_tokenizer, ov_tokenizers, read_vocab

    gguf = open_gguf(gemma4_data.LLAMACPP_FILE)
    recorded = gemma4_data.llamacpp_greedy()["prompts"]
    hf = hf_tokenizer(read_vocab(gguf))
    assert [hf(p["prompt"])["input_ids"] for p in recorded] == [p["ids"] for p in recorded]
    tokenizer, detokenizer = ov_tokenizers(gguf)
    tokenize, detokenize = ov.Core().compile_model(tokenizer, "CPU"), ov.Core().compile_model(detokenizer, "CPU")
    assert [tokenize([p["prompt"]])["input_ids"][0].tolist() for p in recorded] == [p["ids"] for p in recorded]
    assert [detokenize(np.array([p["ids"][1:]]))[0][0] for p in recorded] == [p["prompt"] for p in recorded]


@pytest.mark.slow
def test_the_target_folder_of_llama_cpps_file_alone_generates_llama_simples_text_in_genai(tmp_path):
    """`gguf2ov target gemma4-llamacpp-F32.gguf` and nothing else (the tokenizer from the file): GenAI's
    greedy text of each prompt, in exact arithmetic, is llama-simple's on that file."""
    import gemma4_data

    from gguf2ov.numerics import EXACT
    from gguf2ov.runtime.genai import Prompt, generate, generation_config, make_pipeline

    out = tmp_path / "target"
    assert main(["target", str(gemma4_data.LLAMACPP_FILE), "-o", str(out)]) == 0
    recorded = gemma4_data.llamacpp_greedy()
    pipe = make_pipeline(TargetIR.open(out), "CPU", EXACT)
    config = generation_config(pipe, recorded["new_tokens"], None)
    texts = [generate(pipe, Prompt(p["prompt"]), config, False).text for p in recorded["prompts"]]
    assert texts == [p["text"] for p in recorded["prompts"]]


# --- variants not built yet ---------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    # layers 1-4 share, and no global layer comes before them
    ({"num_kv_shared_layers": 4}, "layer 2 (full_attention) shares the keys and values of an earlier "
                                  "full_attention layer, and the layers before the shared ones have none"),
])
def test_unsupported_variants_are_one_error_line_and_no_folder(tmp_path, shared, fixtures_dir, capsys, changes,
                                                              message):
    import shutil

    folder = tmp_path / "variant"
    shutil.copytree(shared, folder)
    config = tb.config_of(shared) | changes
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["target", str(folder), "-o", str(out), "--tokenizer", str(fixtures_dir / "target-hf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) in (1, 2) and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


# --- in OpenVINO GenAI, with a DFlash draft attached ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("geometry", ["shared-kv", "per-layer-embeddings"])
def test_genai_runs_the_target_with_a_dflash_draft_attached(tmp_path, fixtures_dir, geometry):
    """A random DFlash draft (taps at layers 1 and 3, a sliding layer and a shared one) attached to the
    target in GenAI's continuous-batching pipeline (the paged target, shared layers over their donors'
    caches; with per-layer embeddings, their lookup inside the graph, whose only token input is input_ids): the
    greedy text with the draft is the text of the target alone, on every fixture prompt."""
    from gguf2ov.runtime.genai import GenerationSettings, read_prompts
    from gguf2ov.stages.accept import run_acceptance

    spec = GEMMA4[geometry] | ({"vocab_size_per_layer_input": 512} if geometry == "per-layer-embeddings" else {})
    hf = tb.write_target_checkpoint(tmp_path / "hf", spec, seed=7, vocab=512)  # the fixture tokenizer's
    result = build_target(hf, tmp_path / "target", tokenizer_dir=fixtures_dir / "target-hf")
    assert all(c.status == "pass" for c in result.checks), [(c.name, c.reason) for c in result.checks]
    tb.random_dflash_draft(tmp_path, spec["hidden_size"], [1, 3])
    prompts = read_prompts(fixtures_dir / "prompts.txt")
    r = run_acceptance(TargetIR.open(tmp_path / "target"), tmp_path / "draft", prompts,
                       GenerationSettings(max_new_tokens=24, num_assistant_tokens=5, precision="f32"), progress=False)
    assert r.overall.identical, [p.first_difference for p in r.prompts]
