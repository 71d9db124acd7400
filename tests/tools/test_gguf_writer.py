import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, TokenType
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import save_file

from gguf2ov.cli import main
from gguf2ov.gguf.read import open_gguf
from gguf2ov.job import Job, Options
from gguf2ov.maps.load import load_map
from gguf2ov.maps.shapes import stored_shape
from gguf2ov.tools.gguf_writer import tensor_type, use_more_bits, write_dflash_gguf

Q = GGMLQuantizationType
# hidden 256 so that K-quants apply; o_proj's 128 inputs exercise the Q4_K -> Q5_0 fallback.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, TARGET_IDS, MASK = 256, 2, 1, 64, 256, 5, [1, 9, 17], 300


DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 8}


def _checkpoint(path, layers=LAYERS, seed=0, vocab_size=None, dflash2=False):
    """A random draft checkpoint with every tensor the map requires (and the DFlash 2 group)."""
    rng = np.random.default_rng(seed)
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "tie_word_embeddings": False,
        "hidden_size": HIDDEN, "num_hidden_layers": layers, "intermediate_size": FFN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
        # as transformers 5 saves it; z-lab configs have a top-level rope_theta instead
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "dflash_config": {"block_size": 16, "mask_token_id": MASK, "target_layer_ids": TARGET_IDS},
    }
    if vocab_size:
        config["vocab_size"] = vocab_size
    if dflash2:
        config.update(architectures=["DFlash2DraftModel"], is_causal=False)
        config["dflash_config"].update(DFLASH2)
    amap = load_map("dflash")
    state = {}
    for rule in amap.rules:
        if not (rule.required or (dflash2 and rule.group == "dflash2")) or rule.hf is None:
            continue
        for n in range(layers) if rule.per_layer else [None]:
            hf = rule.hf_name(n)
            shape = stored_shape(rule.ops, amap.shapes.expected(rule, config))
            state[hf] = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 0.05)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, path / "model.safetensors")
    return config, {k: v.to(torch.bfloat16).float().numpy() for k, v in state.items()}


def test_use_more_bits_matches_llama_cpp_examples():
    assert [i for i in range(5) if use_more_bits(i, 5)] == [2, 4]
    assert [i for i in range(2) if use_more_bits(i, 2)] == [1]
    assert [i for i in range(4) if use_more_bits(i, 4)] == [2, 3]


def test_tensor_type_rules():
    assert tensor_type("output.weight", (1000, 256), "Q4_K_M", 5) == Q.Q6_K
    assert tensor_type("blk.2.attn_v.weight", (64, 256), "Q4_K_M", 5) == Q.Q6_K
    assert tensor_type("blk.1.attn_v.weight", (64, 256), "Q4_K_M", 5) == Q.Q4_K
    assert tensor_type("blk.4.ffn_down.weight", (256, 96), "Q4_K_M", 5) == Q.Q8_0   # Q6_K fallback
    assert tensor_type("blk.0.attn_output.weight", (256, 128), "Q4_K_M", 5) == Q.Q5_0  # Q4_K fallback
    assert tensor_type("blk.0.attn_norm.weight", (256,), "Q4_K_M", 5) == Q.F32
    assert tensor_type("blk.0.attn_conv_base", (2, 3, 256), "Q4_K_M", 5) == Q.F32
    assert tensor_type("fc.weight", (256, 100), "Q4_K_M", 5) == Q.F16  # not even 32-divisible


def test_round_trip_q4_k_m(tmp_path):
    config, state = _checkpoint(tmp_path / "ckpt")
    gguf_path = tmp_path / "draft.gguf"
    result = write_dflash_gguf(tmp_path / "ckpt", gguf_path)
    gguf = open_gguf(gguf_path)
    assert gguf.arch == "dflash" and gguf.metadata["general.file_type"] == 15
    assert gguf.metadata["dflash.target_layers"] == [i + 1 for i in TARGET_IDS]
    assert gguf.metadata["tokenizer.ggml.mask_token_id"] == MASK
    assert gguf.metadata["dflash.attention.value_length"] == HEAD_DIM
    types = {name: t.type_name for name, t in gguf.tensors.items()}
    assert types["blk.2.attn_v.weight"] == types["blk.4.ffn_down.weight"] == "Q6_K"
    assert types["blk.1.attn_v.weight"] == types["blk.0.ffn_down.weight"] == types["fc.weight"] == "Q4_K"
    assert types["blk.0.attn_output.weight"] == "Q5_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert result.n_tensors == len(state) == 58

    out = tmp_path / "back"
    back = Job.of(gguf_path, None, Options(progress=False)).convert(out, dtype="f32")
    assert back.target_layer_ids_written == TARGET_IDS
    tensors = load_numpy(out / "model.safetensors")
    for hf_name, original in state.items():
        gguf_name = load_map("dflash").writer.gguf_name_for(hf_name)[0]
        np.testing.assert_array_equal(tensors[hf_name], gguf.load(gguf_name))
        assert np.corrcoef(tensors[hf_name].ravel(), original.ravel())[0, 1] > 0.99, hf_name
    written = json.loads((out / "config.json").read_text())
    for key, value in config.items():
        if key != "rope_parameters":
            assert written[key] == value, key
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(out).rope_parameters == config["rope_parameters"]


def test_mxfp4_moe_mix_is_llama_quants():
    """MXFP4_MOE: experts (ggml ne[2] > 1) in MXFP4, other weights and the head Q8_0; `--pure` MXFP4 everywhere
    (byte for byte against llama-quantize: benchmarks/llamacpp/fixtures.py)."""
    assert tensor_type("blk.0.ffn_gate_exps.weight", (8, 256, 256), "MXFP4_MOE", 5, 8) == Q.MXFP4
    assert tensor_type("blk.0.ffn_down_exps.weight", (8, 256, 96), "MXFP4_MOE", 5, 8) == Q.MXFP4
    assert tensor_type("blk.0.attn_v.weight", (64, 256), "MXFP4_MOE", 5, 8) == Q.Q8_0
    assert tensor_type("output.weight", (1000, 256), "MXFP4_MOE", 5, 8) == Q.Q8_0
    assert tensor_type("blk.0.ffn_gate_inp.weight", (8, 256), "MXFP4_MOE", 5, 8) == Q.F32
    assert tensor_type("blk.0.ffn_up.weight", (256, 96), "MXFP4_MOE", 5, pure=True) == Q.MXFP4
    assert tensor_type("output.weight", (1000, 256), "MXFP4_MOE", 5, pure=True) == Q.MXFP4
    assert tensor_type("fc.weight", (256, 100), "MXFP4_MOE", 5, pure=True) == Q.F16  # not 32-divisible
    assert tensor_type("blk.2.attn_v.weight", (64, 256), "Q4_K_M", 5, pure=True) == Q.Q4_K


def test_round_trip_mxfp4(tmp_path):
    """A dense draft written `--pure` MXFP4_MOE: every weight MXFP4, read back as gguf-py dequantizes
    gguf-py's quantization of the checkpoint's values (what llama-quantize writes)."""
    import gguf

    _, state = _checkpoint(tmp_path / "ckpt", layers=2)
    gguf_path = tmp_path / "draft.gguf"
    result = write_dflash_gguf(tmp_path / "ckpt", gguf_path, mix="MXFP4_MOE", pure=True)
    read = open_gguf(gguf_path)
    assert read.metadata["general.file_type"] == 38 and result.type_counts == {"MXFP4": 15, "F32": 10}
    for hf_name, original in state.items():
        gguf_name = load_map("dflash").writer.gguf_name_for(hf_name)[0]
        if read.info(gguf_name).qtype == Q.MXFP4:
            want = gguf.quants.dequantize(gguf.quants.quantize(original, Q.MXFP4), Q.MXFP4)
            np.testing.assert_array_equal(read.load(gguf_name), want)
            assert np.corrcoef(want.ravel(), original.ravel())[0, 1] > 0.98, hf_name


def test_legacy_layout_needs_the_offset_flag(tmp_path, capsys):
    _checkpoint(tmp_path / "ckpt", layers=2)
    gguf_path = tmp_path / "old.gguf"
    write_dflash_gguf(tmp_path / "ckpt", gguf_path, mix="F32", legacy=True)
    gguf = open_gguf(gguf_path)
    assert gguf.metadata["dflash.target_layers"] == TARGET_IDS and gguf.metadata["dflash.mask_token_id"] == MASK
    assert "tokenizer.ggml.mask_token_id" not in gguf.metadata
    assert main(["convert", str(gguf_path), "-o", str(tmp_path / "x")]) == 1
    assert "dflash.mask_token_id" in capsys.readouterr().err
    result = Job.of(gguf_path, None, Options(target_layer_offset=0, progress=False)).convert(tmp_path / "x")
    assert result.config["dflash_config"] == {"block_size": 16, "mask_token_id": MASK, "target_layer_ids": TARGET_IDS}


def _tokenizer(path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 20, vocab_size=300,
                            min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|mask|>"]})
    tok.add_tokens(["customword"])
    tok.save_pretrained(path)
    return tok


def test_tokenizer_is_written_like_llama_cpp(tmp_path):
    tok = _tokenizer(tmp_path / "tok")
    vocab_size = len(tok) + 3  # ids past the tokenizer's are padded, as llama.cpp does
    _checkpoint(tmp_path / "ckpt", layers=2, vocab_size=vocab_size)
    gguf_path = tmp_path / "draft.gguf"
    write_dflash_gguf(tmp_path / "ckpt", gguf_path, tokenizer_dir=tmp_path / "tok", mix="F16")
    m = open_gguf(gguf_path).metadata
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "qwen2"
    tokens, types = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == vocab_size and tokens[-1] == f"[PAD{vocab_size - 1}]"
    assert types[-1] == TokenType.UNUSED
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    assert tokens[eos] == "<|endoftext|>" and types[eos] == TokenType.CONTROL
    assert m["tokenizer.ggml.eos_token_id"] == eos
    assert types[tok.convert_tokens_to_ids("<|mask|>")] == TokenType.CONTROL
    assert types[tok.convert_tokens_to_ids("customword")] == TokenType.USER_DEFINED
    normal = next(i for t, i in tok.get_vocab().items() if t not in tok.get_added_vocab())
    assert types[normal] == TokenType.NORMAL and tokens[normal] == tok.convert_ids_to_tokens(normal)
    assert len(m["tokenizer.ggml.merges"]) > 0
    assert m["tokenizer.ggml.mask_token_id"] == MASK and m["general.file_type"] == 1


def test_each_tokenizer_key_is_written_once(tmp_path, caplog):
    """The config's bos/eos/pad ids and the tokenizer's special tokens (gguf-py's SpecialVocab) name
    the same keys: each is written once, the tokenizer's where it has one, as llama.cpp's converter
    writes them (gguf-py warned "Duplicated key name" and kept the config's)."""
    import logging

    tok = _tokenizer(tmp_path / "tok")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config, _ = _checkpoint(tmp_path / "ckpt", layers=2, vocab_size=len(tok))
    config.update(bos_token_id=7, eos_token_id=eos + 1, pad_token_id=5)  # the tokenizer states eos only
    (tmp_path / "ckpt/config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        write_dflash_gguf(tmp_path / "ckpt", tmp_path / "draft.gguf", tokenizer_dir=tmp_path / "tok", mix="F16")
    assert not [r.getMessage() for r in caplog.records if "Duplicated key" in r.getMessage()]
    m = open_gguf(tmp_path / "draft.gguf").metadata
    assert m["tokenizer.ggml.eos_token_id"] == eos  # the tokenizer's
    assert m["tokenizer.ggml.bos_token_id"] == 7 and m["tokenizer.ggml.padding_token_id"] == 5  # the config's


def test_unknown_mix(tmp_path):
    from gguf2ov.errors import Gguf2ovError

    with pytest.raises(Gguf2ovError, match="unknown type mix"):
        write_dflash_gguf(tmp_path, tmp_path / "x.gguf", mix="Q3_K_S")


def test_dflash2_is_written_in_llama_cpp_layout(tmp_path):
    """Conv bases F32 without .weight (ne {H, ks, 2}), conv projections and the selector under
    llama.cpp's names and quantized by the Q4_K_M rule, the DFlash 2 keys, target layers + 1; and
    the file converts back to the same DFlash 2 checkpoint."""
    from opened import check

    vocab = 300
    config, state = _checkpoint(tmp_path / "ckpt", vocab_size=vocab, dflash2=True)
    gguf_path = tmp_path / "draft2.gguf"
    result = write_dflash_gguf(tmp_path / "ckpt", gguf_path)
    assert result.n_tensors == len(state) == 81  # 58 of v1 + 4 per layer + 3 selector tensors
    gguf = open_gguf(gguf_path)
    groups, rank = HIDDEN // DFLASH2["conv_group_size"], DFLASH2["selector_rank"]
    for n in range(LAYERS):
        for part, hf in (("attn", "attention_conv"), ("ffn", "mlp_conv")):
            base = gguf.tensors[f"blk.{n}.{part}_conv_base"]
            assert base.type_name == "F32" and base.ne == (HIDDEN, 2, 2)
            # same bytes as HF's [side, tap, H]: no transpose
            np.testing.assert_array_equal(gguf.load(f"blk.{n}.{part}_conv_base"), state[f"layers.{n}.{hf}.base_kernel"])
            proj = gguf.tensors[f"blk.{n}.{part}_conv_proj.weight"]
            assert proj.type_name == "Q4_K" and proj.ne == (HIDDEN, 2 * 2 * groups)
    assert "blk.0.attn_conv_base.weight" not in gguf.tensors
    assert gguf.tensors["selector_hidden.weight"].ne == (HIDDEN, rank)
    assert gguf.tensors["selector_hidden.weight"].type_name == "Q4_K"
    for name in ("selector_predecessor.weight", "selector_successor.weight"):
        # rows of 32: Q4_K falls back to Q5_0, as llama.cpp's quantizer does
        assert gguf.tensors[name].ne == (rank, vocab) and gguf.tensors[name].type_name == "Q5_0"
    m = gguf.metadata
    assert {k: m[f"dflash.{k}"] for k in DFLASH2} == DFLASH2
    assert m["dflash.target_layers"] == [i + 1 for i in TARGET_IDS] and m["dflash.block_size"] == 16
    assert m["dflash.attention.causal"] is False  # a bool, as llama.cpp's converter writes is_causal

    out = tmp_path / "back"
    Job.of(gguf_path, None, Options(progress=False)).convert(out, dtype="f32")
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["DFlash2DraftModel"] and written["is_causal"] is False
    assert written["dflash_config"] == config["dflash_config"]
    tensors = load_numpy(out / "model.safetensors")
    assert set(tensors) == set(state)
    np.testing.assert_array_equal(tensors["layers.3.mlp_conv.base_kernel"], state["layers.3.mlp_conv.base_kernel"])
    assert tensors["candidate_selector.predecessor_codebook"].shape == (vocab, rank)

    report = check(gguf_path, tmp_path / "ckpt", progress=False)
    assert report.passed, report.summary()
    assert {c.key for c in report.config} >= set(DFLASH2)
    # a reference with another group size: the config check says so
    ref = json.loads((tmp_path / "ckpt/config.json").read_text())
    ref["dflash_config"]["conv_group_size"] = 32
    (tmp_path / "ckpt/config.json").write_text(json.dumps(ref))
    report = check(gguf_path, tmp_path / "ckpt", progress=False)
    bad = [c for c in report.config if not c.agrees]
    assert not report.passed and [c.key for c in bad] == ["conv_group_size"]


def test_a_v1_file_keeps_the_v1_architecture(tmp_path):
    _checkpoint(tmp_path / "ckpt", layers=2)
    write_dflash_gguf(tmp_path / "ckpt", tmp_path / "v1.gguf", mix="F32")
    assert "dflash.attention.causal" not in open_gguf(tmp_path / "v1.gguf").metadata  # the config states none
    config = Job.of(tmp_path / "v1.gguf", None, Options(progress=False)).convert(tmp_path / "back").config
    assert config["architectures"] == ["DFlashDraftModel"] and "is_causal" not in config


@pytest.mark.parametrize("where", ["is_causal", "dflash_config.causal"])
def test_a_v1_config_that_states_causal_writes_it(tmp_path, where):
    """llama.cpp's converter writes dflash.attention.causal from is_causal, else from
    dflash_config.causal; the config read back states it as is_causal."""
    config, _ = _checkpoint(tmp_path / "ckpt", layers=2)
    if where == "is_causal":
        config["is_causal"] = False
    else:
        config["dflash_config"]["causal"] = False
    (tmp_path / "ckpt/config.json").write_text(json.dumps(config))
    write_dflash_gguf(tmp_path / "ckpt", tmp_path / "v1.gguf", mix="F32")
    assert open_gguf(tmp_path / "v1.gguf").metadata["dflash.attention.causal"] is False
    back = Job.of(tmp_path / "v1.gguf", None, Options(progress=False)).convert(tmp_path / "back").config
    assert back["is_causal"] is False and back["architectures"] == ["DFlashDraftModel"]


def test_a_transformers_5_config_keeps_its_rope_base(tmp_path, fixtures_dir):
    """transformers 5 nests the RoPE base (rope_parameters.rope_theta): the map still writes it, as
    llama.cpp's converter writes qwen3.rope.freq_base, and reads it back."""
    from gguf2ov.maps.load import open_mapped
    from gguf2ov.tools.gguf_writer import write_gguf

    config = json.loads((fixtures_dir / "target-hf" / "config.json").read_text())
    assert "rope_theta" not in config and config["rope_parameters"]["rope_theta"] == 10000.0
    path = tmp_path / "target.gguf"
    write_gguf(fixtures_dir / "target-hf", path, "qwen3", mix="F32")
    assert open_gguf(path).metadata["qwen3.rope.freq_base"] == 10000.0
    assert open_mapped(path).config["rope_theta"] == 10000.0


def test_a_draft_of_a_gemma4_target_carries_its_vocabulary_as_llama_cpp_writes_it(tmp_path):
    """llama.cpp's DFlash converter writes a draft's vocabulary with its target's own converter (--target-model-dir):
    for a Gemma 4 target that is `gemma4` (Gemma 4's SentencePiece-style BPE, every token scored -1000, no space
    prefix, bos always), not gpt2. The fixture draft of fixtures/tiny-gemma4 carries every tokenizer key llama.cpp's
    converter wrote into the target's file from the same tokenizer, with the same values."""
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-gemma4"
    path = write_dflash_gguf(fixture / "draft-ref", tmp_path / "draft.gguf", tokenizer_dir=fixture / "target-hf",
                             mix="F16").path

    def tokenizer_keys(path):
        return {k: v if isinstance(v, (str, int, float, bool)) else list(v)
                for k, v in open_gguf(path).metadata.items() if k.startswith("tokenizer.")}

    ours, llamacpp = tokenizer_keys(path), tokenizer_keys(fixture / "target-Q4_K_M.gguf")
    assert ours["tokenizer.ggml.model"] == "gemma4"
    assert ours == llamacpp


def test_a_byte_level_tokenizer_is_written_as_gpt2_whatever_the_target(tmp_path):
    """fixtures/tiny-vlm's target is a Gemma 4 VLM with a byte-level BPE, which Gemma 4's converter refuses and
    llama.cpp's gpt2 writer writes (benchmarks/llamacpp/gemma4_vlm.py): its draft's vocabulary stays gpt2."""
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-vlm"
    path = write_dflash_gguf(fixture / "draft-ref", tmp_path / "draft.gguf", tokenizer_dir=fixture / "target-hf",
                             mix="F16").path
    ours, committed = open_gguf(path).metadata, open_gguf(fixture / "draft-Q4_K_M.gguf").metadata
    assert ours["tokenizer.ggml.model"] == "gpt2"
    assert {k: v for k, v in ours.items() if k.startswith("tokenizer.ggml.")}.keys() == \
        {k for k in committed if k.startswith("tokenizer.ggml.")}
    assert list(ours["tokenizer.ggml.tokens"]) == list(committed["tokenizer.ggml.tokens"])
