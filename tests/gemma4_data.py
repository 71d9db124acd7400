"""The gemma4_text checkpoints behind the files llama.cpp's own converter wrote from them
(benchmarks/llamacpp/gemma4.py), with llama.cpp's greedy text on each (tests/data/*.json, which CI reads without
llama.cpp), on the vocabulary of a small SentencePiece-style BPE tokenizer, as Gemma 4's converter requires:
- CONFIG, tests/targets/test_gemma4_target.py's shared-KV geometry (sliding and global layers of head sizes
  16 and 32, attention_k_eq_v, two shared-KV layers): tests/data/gemma4-llamacpp-F32.gguf, its Q4_K_M by
  llama-quantize, gemma4-llamacpp.json;
- MOE_CONFIG, Gemma 4 26B-A4B's layer in small (the dense MLP and 4 experts beside it, top 2):
  gemma4-moe-llamacpp-F32.gguf, gemma4-moe-llamacpp.json;
- PLE_CONFIG, E2B/E4B-like: per-layer embeddings (8 values a layer), v_proj in every layer, the last two
  layers (one sliding, one global) sharing the keys and values of the first two: gemma4-ple-llamacpp-F32.gguf,
  gemma4-ple-llamacpp.json;
- E2B_CONFIG, E2B-like: PLE_CONFIG with use_double_wide_mlp (the MLPs of the two shared-KV layers twice as wide),
  which llama.cpp's converter writes as a feed_forward_length per layer: gemma4-e2b-llamacpp-F32.gguf,
  gemma4-e2b-llamacpp.json.

Every value is computed from its tensor's name and position with integer arithmetic alone (no random
generator whose stream could change), as a multiple of 1/1024 below 2 in magnitude: the file holds the
checkpoint's values exactly.
"""

import json
import zlib
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
LLAMACPP_FILE = DATA / "gemma4-llamacpp-F32.gguf"
LLAMACPP_Q4_K_M = DATA / "gemma4-llamacpp-Q4_K_M.gguf"  # llama-quantize's of LLAMACPP_FILE
LLAMACPP_GREEDY = DATA / "gemma4-llamacpp.json"
MOE_FILE = DATA / "gemma4-moe-llamacpp-F32.gguf"
MOE_GREEDY = DATA / "gemma4-moe-llamacpp.json"
LLAMACPP_PLE_FILE = DATA / "gemma4-ple-llamacpp-F32.gguf"
LLAMACPP_PLE_GREEDY = DATA / "gemma4-ple-llamacpp.json"
LLAMACPP_E2B_FILE = DATA / "gemma4-e2b-llamacpp-F32.gguf"
LLAMACPP_E2B_GREEDY = DATA / "gemma4-e2b-llamacpp.json"

CONFIG = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": 384, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
    "num_kv_shared_layers": 2, "sliding_window": 4, "final_logit_softcapping": 30.0,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "hidden_size_per_layer_input": 0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512, "tie_word_embeddings": True, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}
# three layers (sliding, sliding, global: transformers makes the last layer global), each its own keys and
# values, and in each the dense MLP with 4 experts of width 32 beside it, 2 chosen per token
MOE_CONFIG = CONFIG | {
    "intermediate_size": 64, "num_hidden_layers": 3, "num_kv_shared_layers": 0,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
}
PLE_CONFIG = CONFIG | {
    "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 1, "attention_k_eq_v": False, "num_global_key_value_heads": None,
    "num_kv_shared_layers": 2, "layer_types": ["sliding_attention", "full_attention"] * 2,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 384,
}
E2B_CONFIG = PLE_CONFIG | {"use_double_wide_mlp": True}


def values(name: str, shape) -> np.ndarray:
    """The tensor's values: multiples of 1/1024 from a hash of its name and each position."""
    n = int(np.prod(shape))
    seed = np.uint64(zlib.crc32(name.encode()))
    h = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + seed * np.uint64(40503)) % np.uint64(1 << 32)
    u = ((h >> np.uint64(8)) % np.uint64(1024)).astype(np.int64) - 512  # -512 .. 511
    if name.endswith("layer_scalar"):
        k = 768 + u // 2  # an output scale of 0.5 .. 1
    elif "norm" in name or name.endswith(("router.scale", "per_expert_scale")):
        k = 1024 + u // 2  # Gemma 4's norms scale by w, and its router's scales: near 1
    else:
        k = u // 2
    return (k / 1024).astype(np.float32).reshape(shape)


def write_checkpoint(folder: Path, config: dict = CONFIG) -> Path:
    """The checkpoint of `config` (CONFIG, MOE_CONFIG, PLE_CONFIG or E2B_CONFIG; no tokenizer: the converter's is
    benchmarks/llamacpp/gemma4.py's) in `folder`, saved by transformers 5.5.4's Gemma4ForCausalLM with
    every parameter and buffer set by `values`."""
    import torch
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    config = CONFIG_MAPPING["gemma4_text"].from_dict({k: v for k, v in config.items() if k != "model_type"})
    model = AutoModelForCausalLM.from_config(config)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, tensor in state.items():
            if tensor.is_floating_point() and tensor.shape and "rotary_emb" not in name and "embed_scale" not in name:
                tensor.copy_(torch.from_numpy(values(name, tuple(tensor.shape))))
    model.save_pretrained(folder)
    return folder


def llamacpp_greedy(path: Path = LLAMACPP_GREEDY) -> dict:
    """What benchmarks/llamacpp/gemma4.py recorded (LLAMACPP_GREEDY, MOE_GREEDY, LLAMACPP_PLE_GREEDY or
    LLAMACPP_E2B_GREEDY): per prompt,
    llama-tokenize's ids and llama-simple's text on each file."""
    return json.loads(path.read_text())


def greedy_ids(xml, prompt_ids: list[int], new_tokens: int, eos: int, margins: list | None = None) -> list[int]:
    """The target's greedy continuation, one stateful step per token (float32, exact arithmetic); `margins`
    gets each step's gap between its top two logits."""
    import openvino as ov

    from gguf2ov.numerics import EXACT, core

    request = core().compile_model(ov.Core().read_model(str(xml)), "CPU", {**EXACT, "KV_CACHE_PRECISION": "f32"}
                                   ).create_infer_request()
    ids, out, past = list(prompt_ids), [], 0
    while len(out) < new_tokens:
        result = request.infer({"input_ids": np.array([ids], np.int64),
                                "attention_mask": np.ones((1, past + len(ids)), np.int64),
                                "position_ids": np.arange(past, past + len(ids))[None],
                                "beam_idx": np.zeros(1, np.int32)})
        past += len(ids)
        token = int(np.argmax(result["logits"][0, -1]))
        if margins is not None:
            top = np.sort(result["logits"][0, -1])
            margins.append(float(top[-1] - top[-2]))
        if token == eos:
            break
        out.append(token)
        ids = [token]
    return out


def pieces_text(gguf, ids: list[int]) -> str:
    """The text of `ids` as llama.cpp renders a SentencePiece-style vocabulary: U+2581 as a space, a byte
    token as its byte, each piece printed as llama-simple prints it (printf "%s": up to a NUL byte, so
    <0x00> prints nothing), the bytes decoded as llama-simple's output was (invalid UTF-8 replaced)."""
    tokens, types = gguf.metadata["tokenizer.ggml.tokens"], gguf.metadata["tokenizer.ggml.token_type"]
    out = b""
    for i in ids:
        piece = str(tokens[i])
        piece = bytes([int(piece[3:5], 16)]) if int(types[i]) == 6 else piece.replace("\u2581", " ").encode()
        out += piece.split(b"\0", 1)[0]
    return out.decode("utf-8", "replace")


def greedy_texts(xml, gguf, recorded: dict) -> list[str]:
    """The target's greedy text of each recorded prompt (from llama-tokenize's ids, `new_tokens` at most,
    stopping at the file's eos), read through the file's own vocabulary."""
    eos = int(gguf.metadata["tokenizer.ggml.eos_token_id"])
    return [pieces_text(gguf, greedy_ids(xml, p["ids"], recorded["new_tokens"], eos)) for p in recorded["prompts"]]
