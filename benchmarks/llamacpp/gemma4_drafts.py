"""llama.cpp's own converter on tiny Gemma 4 drafts that GenAI does not run: the files gguf2ov names and refuses.

    python -m benchmarks.llamacpp.gemma4_drafts    # writes the three files below into tests/data/

- tests/data/gemma4-dspark-llamacpp-F16.gguf: a Gemma 4 DSpark draft (`Gemma4DSparkModel`, conversion/gemma.py):
  general.architecture `dflash`, one full-attention layer whose K is also its V (`attention_k_eq_v`), GELU,
  the Gemma norms around attention and MLP, its own lm_head, and the DSpark heads `markov_w1`, `markov_w2`
  (a Markov bias on each block position's logits from the token before it) and `conf_proj` (a confidence head).
- tests/data/gemma4-assistant-llamacpp-F16.gguf: a Gemma 4 MTP assistant draft (`Gemma4AssistantForCausalLM`):
  general.architecture `gemma4-assistant`, one layer with Q but no K or V (it reads the target's KV cache),
  the projections into and out of the target's width (`nextn.*_projection`).
- tests/data/gemma4-dflash-llamacpp-F16.gguf: beside them, a DFlash draft of the same Gemma 4 target (z-lab's
  layout, `DFlashDraftModel`), which GenAI runs: the file the other two are told apart from, converted.

All take a tokenizer trained here in Gemma's form (byte-fallback BPE, `▁` for a space: llama.cpp's Gemma 4
converter reads no other), the DSpark draft from a target folder beside it (--target-model-dir, as llama.cpp's
DFlash converter reads it: a Gemma4ForCausalLM config), the assistant from its own folder. Needs
llama.cpp built by benchmarks/llamacpp/tools.py (0c1e570: its convert_hf_to_gguf.py and gguf-py). The checkpoints
are written here with numpy (no transformers class loads either): each config carries what the converter
requires of it, each tensor the name its converter maps. Values are random (seed 0): the files are read for
what they are, not run.
"""

import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import REPO, TEST_DATA
from benchmarks.llamacpp.tools import built, convert

DSPARK_FILE = TEST_DATA / "gemma4-dspark-llamacpp-F16.gguf"
ASSISTANT_FILE = TEST_DATA / "gemma4-assistant-llamacpp-F16.gguf"
DFLASH_FILE = TEST_DATA / "gemma4-dflash-llamacpp-F16.gguf"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
CORPUS = ["the quick brown fox jumps over the lazy dog", "a draft proposes tokens that the target checks"]
VOCAB, HIDDEN, HEADS, HEAD_DIM, FFN = 288, 32, 2, 16, 64  # 5 specials, 256 byte tokens, 27 learned
ROPE = {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}

DSPARK_CONFIG = {
    "architectures": ["Gemma4DSparkModel"], "model_type": "gemma4_text", "vocab_size": VOCAB, "hidden_size": HIDDEN,
    "intermediate_size": FFN, "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": 1,
    "num_global_key_value_heads": 1, "head_dim": HEAD_DIM, "global_head_dim": HEAD_DIM, "attention_k_eq_v": True,
    "layer_types": ["full_attention"], "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024, "tie_word_embeddings": False, "rope_parameters": {"full_attention": ROPE["full_attention"]},
    "dflash_config": {"block_size": 8, "mask_token_id": 4, "target_layer_ids": [1, 2], "markov_head_type": "vanilla"},
    "markov_rank": 8, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}
ASSISTANT_CONFIG = {
    "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_text", "vocab_size": VOCAB,
    "hidden_size": HIDDEN, "backbone_hidden_size": 2 * HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 1,
    "num_attention_heads": HEADS, "num_key_value_heads": 1, "head_dim": HEAD_DIM, "global_head_dim": HEAD_DIM,
    "num_kv_shared_layers": 1, "layer_types": ["full_attention"], "sliding_window": 64,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
    "tie_word_embeddings": True, "rope_parameters": ROPE, "final_logit_softcapping": 30.0,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}

DFLASH_CONFIG = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN,
    "intermediate_size": FFN, "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": 1,
    "head_dim": HEAD_DIM, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
    "rope_theta": 1e4, "tie_word_embeddings": False, "block_size": 8,
    "dflash_config": {"block_size": 8, "mask_token_id": 4, "target_layer_ids": [1, 2]},
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}


def layer(prefix: str, kv: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma 4 decoder layer's tensors; `kv`: a K projection of its own (which a k_eq_v layer reads as V too)."""
    q = HEADS * HEAD_DIM
    out = {f"{prefix}self_attn.q_proj.weight": (q, HIDDEN), f"{prefix}self_attn.o_proj.weight": (HIDDEN, q),
           f"{prefix}self_attn.q_norm.weight": (HEAD_DIM,), f"{prefix}mlp.gate_proj.weight": (FFN, HIDDEN),
           f"{prefix}mlp.up_proj.weight": (FFN, HIDDEN), f"{prefix}mlp.down_proj.weight": (HIDDEN, FFN),
           f"{prefix}layer_scalar": (1,)}
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        out[f"{prefix}{norm}.weight"] = (HIDDEN,)
    if kv:
        out |= {f"{prefix}self_attn.k_proj.weight": (HEAD_DIM, HIDDEN), f"{prefix}self_attn.k_norm.weight": (HEAD_DIM,)}
    return out


def dspark_shapes() -> dict[str, tuple[int, ...]]:
    rank, taps = DSPARK_CONFIG["markov_rank"], len(DSPARK_CONFIG["dflash_config"]["target_layer_ids"])
    return layer("model.layers.0.", kv=True) | {
        "model.fc.weight": (HIDDEN, taps * HIDDEN), "model.hidden_norm.weight": (HIDDEN,),
        "model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN),
        "markov_head.markov_w1.weight": (VOCAB, rank), "markov_head.markov_w2.weight": (VOCAB, rank),
        "confidence_proj.weight": (1, HIDDEN + rank), "confidence_proj.bias": (1,)}


def assistant_shapes() -> dict[str, tuple[int, ...]]:
    backbone = ASSISTANT_CONFIG["backbone_hidden_size"]
    return layer("model.layers.0.", kv=False) | {
        "model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
        "pre_projection.weight": (HIDDEN, 2 * backbone), "post_projection.weight": (backbone, HIDDEN)}


def dflash_shapes() -> dict[str, tuple[int, ...]]:
    """z-lab's draft layout: Qwen3 layers without the `model.` prefix, the fc over the target's taps."""
    q, kv, p = HEADS * HEAD_DIM, HEAD_DIM, "layers.0."
    return {"fc.weight": (HIDDEN, 2 * HIDDEN), "hidden_norm.weight": (HIDDEN,), "norm.weight": (HIDDEN,),
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (q, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
            p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, q),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN)}


def write_tokenizer(folder: Path) -> None:
    """A byte-fallback BPE in Gemma's form, loaded as it is by transformers (PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + bytes_))
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "mask_token": "<mask>", "add_bos_token": True}, indent=2))


def write_checkpoint(folder: Path, config: dict, shapes: dict, tokenizer: bool) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(0)
    save_file({name: (0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        write_tokenizer(folder)
    return folder


def write_target(folder: Path) -> Path:
    """What the DSpark converter reads of its target: the config (to pick the vocabulary's reader) and tokenizer."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
                                                    "vocab_size": VOCAB, "hidden_size": HIDDEN}, indent=2))
    write_tokenizer(folder)
    return folder


def main() -> None:
    if built() is None:
        raise SystemExit("llama.cpp is not built: run `python -m benchmarks.llamacpp.tools` first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dspark = write_checkpoint(work / "dspark", DSPARK_CONFIG, dspark_shapes(), tokenizer=False)
        target = write_target(work / "target")
        convert(dspark, DSPARK_FILE, "f16", "--target-model-dir", str(target))
        dflash = write_checkpoint(work / "dflash", DFLASH_CONFIG, dflash_shapes(), tokenizer=False)
        convert(dflash, DFLASH_FILE, "f16", "--target-model-dir", str(target))
        assistant = write_checkpoint(work / "assistant", ASSISTANT_CONFIG, assistant_shapes(), tokenizer=True)
        convert(assistant, ASSISTANT_FILE, "f16")
    for path in (DSPARK_FILE, ASSISTANT_FILE, DFLASH_FILE):
        print(f"{path.relative_to(REPO)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
