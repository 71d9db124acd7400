"""The qwen3_5_text checkpoint behind tests/data/qwen35-mtp-llamacpp-F16.gguf, which llama.cpp's own
converter wrote from it (benchmarks/llamacpp/qwen35.py): a hybrid decoder of one Gated DeltaNet layer
and one gated attention layer, fewer key than value heads, and the MTP block the hub's checkpoints
carry, saved as transformers 5.5.4 saves Qwen3_5ForCausalLM (under model.language_model.); and MOE_CONFIG, the
qwen3_5_moe_text checkpoint behind tests/data/qwen35moe-mtp-llamacpp-F16.gguf.

Every value is computed from its tensor's name and position with integer arithmetic alone (no random
generator whose stream could change), as a multiple of 1/1024 below 2 in magnitude: float16 holds it
exactly, so the F16 file holds the checkpoint's values but where llama.cpp computes new ones (norms
+ 1, ssm_a = -exp(A_log)).
"""

import json
import zlib
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
LLAMACPP_FILE = DATA / "qwen35-mtp-llamacpp-F16.gguf"
MOE_LLAMACPP_FILE = DATA / "qwen35moe-mtp-llamacpp-F16.gguf"
TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-dflash" / "target-hf"

# llama.cpp's qwen35 loader takes the value head size to be the key head size: dk = dv here
CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 512, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "layer_types": ["linear_attention", "full_attention"],
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": True, "hidden_act": "silu",
    # llama.cpp's mRoPE sections count rotary pairs and must fit them: 4 rotary dimensions are 2 pairs
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 0]},
    "mtp_num_hidden_layers": 1, "eos_token_id": 0, "bos_token_id": 0, "pad_token_id": 1,
}


def shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by its saved name."""
    c = CONFIG
    h, ffn, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nk, nv, dk, dv = (c[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                     "linear_value_head_dim"))
    conv = 2 * nk * dk + nv * dv

    def mlp(p):
        return {p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
                p + "mlp.down_proj.weight": (h, ffn)}

    def attention(p):
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        return {p + "self_attn.q_proj.weight": (2 * q, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}

    def norms(p):
        return {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}

    out = {"model.language_model.embed_tokens.weight": (c["vocab_size"], h), "model.language_model.norm.weight": (h,)}
    p = "model.language_model.layers.0."
    out |= norms(p) | mlp(p) | {
        p + "linear_attn.in_proj_qkv.weight": (conv, h), p + "linear_attn.in_proj_z.weight": (nv * dv, h),
        p + "linear_attn.in_proj_b.weight": (nv, h), p + "linear_attn.in_proj_a.weight": (nv, h),
        p + "linear_attn.conv1d.weight": (conv, 1, c["linear_conv_kernel_dim"]), p + "linear_attn.A_log": (nv,),
        p + "linear_attn.dt_bias": (nv,), p + "linear_attn.norm.weight": (dv,), p + "linear_attn.out_proj.weight": (h, nv * dv)}
    out |= norms("model.language_model.layers.1.") | mlp("model.language_model.layers.1.") | \
        attention("model.language_model.layers.1.")
    out |= norms("mtp.layers.0.") | mlp("mtp.layers.0.") | attention("mtp.layers.0.") | {
        "mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,), "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,)}
    return out


def values(name: str, shape) -> np.ndarray:
    """The tensor's values: multiples of 1/1024 from a hash of its name and each position."""
    n = int(np.prod(shape))
    seed = np.uint64(zlib.crc32(name.encode()))
    h = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + seed * np.uint64(40503)) % np.uint64(1 << 32)
    u = ((h >> np.uint64(8)) % np.uint64(1024)).astype(np.int64) - 512  # -512 .. 511
    if name.endswith("linear_attn.norm.weight"):
        k = 1024 + u // 2  # a gated norm scales by w: near 1
    elif "norm" in name:
        k = u // 2  # (1 + w) norms: w near 0
    elif name.endswith(("A_log", "dt_bias")):
        k = u  # -exp(A_log) in -1.65 .. -0.61
    else:
        k = u // 2
    return (k / 1024).astype(np.float32).reshape(shape)


def write_checkpoint(folder: Path) -> Path:
    """The checkpoint, with the fixture target's tokenizer (vocabulary 512), in `folder`."""
    import shutil

    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
    save_file({name: values(name, shape) for name, shape in shapes().items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    return folder


# The qwen3_5_moe_text checkpoint behind tests/data/qwen35moe-mtp-llamacpp-F16.gguf (benchmarks/llamacpp/qwen35.py
# --moe; tests/targets/test_hybrid_moe_target.py): one linear and one full layer, 2 key / 4 value heads (llama.cpp
# takes dv = dk), 8 experts top 2, the MTP block the hub's checkpoints carry (a full-attention block with the same
# MoE MLP). Values from `values`: multiples of 1/1024 that float16 holds exactly.
MOE_CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "vocab_size": 512,
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "layer_types": ["linear_attention", "full_attention"], "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": True, "hidden_act": "silu",
    # llama.cpp's mRoPE sections count rotary pairs and must fit them: 4 rotary dimensions are 2 pairs
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 0]},
    "mtp_num_hidden_layers": 1, "eos_token_id": 0, "bos_token_id": 0, "pad_token_id": 1,
}


def write_moe_checkpoint(folder: Path) -> Path:
    """MOE_CONFIG's checkpoint as transformers 5.5.4 saves Qwen3_5MoeForCausalLM (under
    model.language_model., experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I]), with an MTP
    block (`mtp.layers.0.*` shaped as the full layer, `mtp.fc`, its norms) and the fixture tokenizer."""
    import shutil

    import torch
    from safetensors.numpy import save_file
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    c = MOE_CONFIG
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig.from_dict(c))
    shapes = {"model.language_model." + n[len("model."):]: tuple(p.shape) for n, p in model.state_dict().items()
              if n.startswith("model.")}
    full, h = "model.language_model.layers.1.", c["hidden_size"]
    shapes |= {"mtp.layers.0." + n[len(full):]: s for n, s in shapes.items() if n.startswith(full)}
    shapes |= {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
               "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    save_file({n: values(n, s) for n, s in shapes.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    return folder
