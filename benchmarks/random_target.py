"""Real-size random targets for cost measurements: bf16 Hugging Face checkpoints of Qwen3, Qwen3.5
(hybrid) and Qwen3-MoE geometries, written in seconds per GB, and their optimum-intel export.

The values do not matter for what is measured (memory, time, compiles), only the geometry, the
dtype and the layout a user's checkpoint has: sharded safetensors in bf16 (`model-0000i-of-0000n`,
an index), a `config.json` and a tokenizer. Weights are N(0, 0.02) in bf16, taken from one
pool of random values at random offsets (a 4B checkpoint would otherwise take minutes of random
number generation); norms and other 1-D tensors are 1 + noise.

The layouts are what transformers' save_pretrained writes and the hub's checkpoints hold:
- qwen3: `model.*`, `lm_head.weight` when untied;
- qwen3_5_text (a geometry with linear-attention heads): Gated DeltaNet layers with a full-attention
  layer every `full_every`-th, under `model.language_model.` (as transformers 5 saves
  Qwen3_5ForCausalLM), and, with `mtp`, the multi-token-prediction block under `mtp.` that the hub's
  checkpoints carry beside the decoder;
- qwen3_moe (a geometry with experts): one 2-D tensor per expert (`mlp.experts.{e}.gate_proj.weight`).

The tokenizer is the fixture target's byte-level BPE with its vocabulary padded to the geometry's
size by tokens its merges never produce: it encodes as the fixture's does and decodes every id a
random model can emit.

    python -m benchmarks.random_target qwen3-4b           # builds (or finds) the checkpoint, prints its path
    python -m benchmarks.random_target qwen3-4b --export int4   # and optimum-cli's int4 g128 export of it
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, REPO

FIXTURE_TARGET = REPO / "fixtures" / "tiny-dflash" / "target-hf"
SHARD_BYTES = 4 << 30  # transformers' default max_shard_size ("5GB") in spirit: a few shards
BUILDER_VERSION = 1


@dataclass(frozen=True)
class TargetGeometry:
    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    rope_theta: float = 1000000.0
    # Qwen3.5 (qwen3_5_text): linear-attention (Gated DeltaNet) heads, a full-attention layer every
    # `full_every`-th, the MTP block (0: none)
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_head_dim: int = 128
    conv_kernel: int = 4
    full_every: int = 4
    mtp: int = 0
    # Qwen3-MoE (qwen3_moe): experts in every layer
    experts: int = 0
    experts_per_tok: int = 0
    moe_ffn: int = 0
    note: str = ""

    @property
    def hybrid(self) -> bool:
        return self.linear_value_heads > 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def model_type(self) -> str:
        return "qwen3_5_text" if self.hybrid else "qwen3_moe" if self.moe else "qwen3"

    @property
    def prefix(self) -> str:
        """Where the checkpoint keeps the decoder."""
        return "model.language_model." if self.hybrid else "model."

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_every == 0 else "linear_attention" for i in range(self.layers)]

    def config(self) -> dict:
        config = {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "intermediate_size": self.ffn, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied, "rms_norm_eps": 1e-6, "rope_theta": self.rope_theta,
            "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
            "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": self.layers, "bos_token_id": 0, "eos_token_id": 0,
            "pad_token_id": 1, "dtype": "bfloat16",
        }
        if self.hybrid:  # Qwen3.5's text config, as its hub checkpoints state it
            for key in ("rope_theta", "use_sliding_window", "sliding_window", "max_window_layers"):
                del config[key]
            config |= {
                "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
                "max_position_embeddings": 262144, "attn_output_gate": True, "layer_types": self.layer_types(),
                "full_attention_interval": self.full_every, "linear_conv_kernel_dim": self.conv_kernel,
                "linear_key_head_dim": self.linear_head_dim, "linear_value_head_dim": self.linear_head_dim,
                "linear_num_key_heads": self.linear_key_heads, "linear_num_value_heads": self.linear_value_heads,
                "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": self.mtp,
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta, "partial_rotary_factor": 0.25,
                                    "mrope_section": [11, 11, 10], "mrope_interleaved": True},
            }
        if self.moe:
            config |= {
                "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": self.experts,
                "num_experts_per_tok": self.experts_per_tok, "moe_intermediate_size": self.moe_ffn,
                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": False,
                "router_aux_loss_coef": 0.001,
            }
        return config

    def _attention(self, p: str) -> dict[str, tuple[int, ...]]:
        h, hd, q = self.hidden, self.head_dim, self.heads * self.head_dim
        return {p + "self_attn.q_proj.weight": (2 * q if self.hybrid else q, h),  # Qwen3.5: [query | gate] per head
                p + "self_attn.k_proj.weight": (self.kv_heads * hd, h),
                p + "self_attn.v_proj.weight": (self.kv_heads * hd, h), p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}

    def _linear_attention(self, p: str) -> dict[str, tuple[int, ...]]:
        h, d, nk, nv = self.hidden, self.linear_head_dim, self.linear_key_heads, self.linear_value_heads
        conv = 2 * nk * d + nv * d
        return {p + "linear_attn.in_proj_qkv.weight": (conv, h), p + "linear_attn.in_proj_z.weight": (nv * d, h),
                p + "linear_attn.in_proj_b.weight": (nv, h), p + "linear_attn.in_proj_a.weight": (nv, h),
                p + "linear_attn.conv1d.weight": (conv, 1, self.conv_kernel), p + "linear_attn.A_log": (nv,),
                p + "linear_attn.dt_bias": (nv,), p + "linear_attn.norm.weight": (d,),
                p + "linear_attn.out_proj.weight": (h, nv * d)}

    def _mlp(self, p: str) -> dict[str, tuple[int, ...]]:
        h = self.hidden
        if not self.moe:
            return {p + "mlp.gate_proj.weight": (self.ffn, h), p + "mlp.up_proj.weight": (self.ffn, h),
                    p + "mlp.down_proj.weight": (h, self.ffn)}
        shapes = {p + "mlp.gate.weight": (self.experts, h)}
        for e in range(self.experts):
            q = f"{p}mlp.experts.{e}."
            shapes |= {q + "gate_proj.weight": (self.moe_ffn, h), q + "up_proj.weight": (self.moe_ffn, h),
                       q + "down_proj.weight": (h, self.moe_ffn)}
        return shapes

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint, by its saved name."""
        h, m = self.hidden, self.prefix
        shapes = {m + "embed_tokens.weight": (self.vocab, h), m + "norm.weight": (h,)}
        if not self.tied:
            shapes["lm_head.weight"] = (self.vocab, h)
        types = self.layer_types() if self.hybrid else ["full_attention"] * self.layers
        for i, kind in enumerate(types):
            p = f"{m}layers.{i}."
            shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
            shapes |= self._attention(p) if kind == "full_attention" else self._linear_attention(p)
            shapes |= self._mlp(p)
        for i in range(self.mtp):  # a full-attention layer, and its fc over [embedding | hidden]
            p = f"mtp.layers.{i}."
            shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       **self._attention(p), **self._mlp(p)}
        if self.mtp:
            shapes |= {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                       "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
        return shapes

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    def key(self) -> str:
        """Cache key: every field that changes the bytes, plus the builder version (the hybrid and MoE
        fields only when set, so that the keys of the dense geometries stay what they were)."""
        import hashlib

        fields = {k: v for k, v in asdict(self).items()
                  if k != "note" and (k in _DENSE_FIELDS or v != _DEFAULTS[k])}
        return hashlib.sha256(json.dumps({"v": BUILDER_VERSION, **fields}, sort_keys=True).encode()).hexdigest()[:10]


_DENSE_FIELDS = ("name", "hidden", "layers", "ffn", "heads", "kv_heads", "head_dim", "vocab", "tied", "rope_theta")
_DEFAULTS = {f.name: f.default for f in fields(TargetGeometry)}


@dataclass(frozen=True)
class Gemma4Geometry:
    """A Gemma 4 text model (`gemma4_text`): sliding-window layers with `kv_heads` heads of `head_dim`,
    every `global_every`-th layer global with `global_kv_heads` heads of `global_head_dim` and, with `k_eq_v`,
    no V projection; the last `shared_kv_layers` layers read earlier layers' keys and values; with
    `per_layer_input` > 0, per-layer embeddings of that many values a layer (E2B, E4B); tied head.
    With `experts`, every layer has a mixture of `experts` experts of width `moe_ffn` (`experts_per_tok`
    chosen per token) beside its dense MLP (enable_moe_block: Gemma 4 26B-A4B)."""
    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    global_kv_heads: int
    global_head_dim: int
    vocab: int
    global_every: int = 6
    sliding_window: int = 1024
    k_eq_v: bool = True
    shared_kv_layers: int = 0
    experts: int = 0
    experts_per_tok: int = 0
    moe_ffn: int = 0
    per_layer_input: int = 0
    note: str = ""
    tied = True
    hybrid = False
    model_type = "gemma4_text"

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.global_every == 0 else "sliding_attention"
                for i in range(self.layers)]

    def config(self) -> dict:
        return {
            "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": self.vocab,
            "hidden_size": self.hidden, "intermediate_size": self.ffn, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "global_head_dim": self.global_head_dim, "num_global_key_value_heads": self.global_kv_heads,
            "attention_k_eq_v": self.k_eq_v, "num_kv_shared_layers": self.shared_kv_layers,
            "sliding_window": self.sliding_window, "layer_types": self.layer_types(),
            "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": self.per_layer_input,
            "vocab_size_per_layer_input": self.vocab,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "tie_word_embeddings": True, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
            "dtype": "bfloat16",
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}},
        } | ({"enable_moe_block": True, "num_experts": self.experts, "top_k_experts": self.experts_per_tok,
              "moe_intermediate_size": self.moe_ffn} if self.moe else {})

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter of transformers' Gemma4ForCausalLM of this config, by its saved name (the
        model built on the meta device: no memory)."""
        import torch
        from transformers import AutoModelForCausalLM, CONFIG_MAPPING

        config = CONFIG_MAPPING["gemma4_text"].from_dict({k: v for k, v in self.config().items() if k != "model_type"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return {n: tuple(p.shape) for n, p in model.state_dict().items()
                if n != "lm_head.weight" and "rotary_emb" not in n and "embed_scale" not in n}

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    def key(self) -> str:
        """Cache key (the MoE and per-layer-input fields only when set, so that the dense geometries' keys
        stay what they were)."""
        import hashlib

        fields = {k: v for k, v in asdict(self).items()
                  if k != "note" and not (k in ("experts", "experts_per_tok", "moe_ffn", "per_layer_input") and not v)}
        return hashlib.sha256(json.dumps({"v": BUILDER_VERSION, **fields}, sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class GptOssGeometry:
    """A gpt-oss model (`gpt_oss`): attention with q/k/v/o biases and a sink logit per query head, sliding
    and full layers alternating (the first sliding), YaRN RoPE, `experts` biased experts of width `ffn`
    (top `experts_per_tok`) behind a biased router in every layer, an untied head. `shapes` names its
    tensors as the gpt-oss map does in llama.cpp's layout (gate and up apart, each [E, N, K])."""
    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    experts_per_tok: int
    sliding_window: int = 128
    rope_theta: float = 150000.0
    rope_factor: float = 32.0
    original_context: int = 4096
    context_length: int = 131072
    note: str = ""
    tied = False
    hybrid = False
    moe = True
    model_type = "gpt_oss"
    mix = "MXFP4_MOE"

    def layer_types(self) -> list[str]:  # GptOssConfig's default: the even layers sliding
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.layers)]

    def config(self) -> dict:
        """openai/gpt-oss-20b's config.json in transformers 5's keys (rope_parameters), for this geometry."""
        return {
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": self.vocab,
            "hidden_size": self.hidden, "intermediate_size": self.ffn, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "num_local_experts": self.experts, "num_experts_per_tok": self.experts_per_tok,
            "sliding_window": self.sliding_window, "layer_types": self.layer_types(),
            "max_position_embeddings": self.context_length, "rms_norm_eps": 1e-5, "attention_bias": True,
            "tie_word_embeddings": False, "hidden_act": "silu", "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9,
            "output_router_logits": False, "initializer_range": 0.02, "use_cache": True,
            "eos_token_id": 0, "pad_token_id": 1, "bos_token_id": 0, "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "yarn", "factor": self.rope_factor, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": self.original_context,
                                "rope_theta": self.rope_theta},
        }

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor by the gpt-oss map's HF name, in llama.cpp's shapes (numpy order)."""
        h, q, kv, e, n = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.experts, self.ffn
        shapes = {"model.embed_tokens.weight": (self.vocab, h), "model.norm.weight": (h,),
                  "lm_head.weight": (self.vocab, h)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            a, x = p + "self_attn.", p + "mlp.experts."
            shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       a + "q_proj.weight": (q, h), a + "q_proj.bias": (q,), a + "k_proj.weight": (kv, h),
                       a + "k_proj.bias": (kv,), a + "v_proj.weight": (kv, h), a + "v_proj.bias": (kv,),
                       a + "o_proj.weight": (h, q), a + "o_proj.bias": (h,), a + "sinks": (self.heads,),
                       p + "mlp.router.weight": (e, h), p + "mlp.router.bias": (e,),
                       x + "gate_proj": (e, n, h), x + "up_proj": (e, n, h), x + "down_nk": (e, h, n),
                       x + "gate_proj_bias": (e, n), x + "up_proj_bias": (e, n), x + "down_proj_bias": (e, h)}
        return shapes

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    def key(self) -> str:
        import hashlib

        fields = {k: v for k, v in asdict(self).items() if k != "note"}
        return hashlib.sha256(json.dumps({"v": BUILDER_VERSION, **fields}, sort_keys=True).encode()).hexdigest()[:10]


GEOMETRIES = {g.name: g for g in [
    TargetGeometry("tiny", hidden=256, layers=4, ffn=768, heads=4, kv_heads=2, head_dim=64, vocab=2048, tied=True),
    TargetGeometry("qwen3-1.7b", hidden=2048, layers=28, ffn=6144, heads=16, kv_heads=8, head_dim=128, vocab=151936,
                   tied=True),
    TargetGeometry("qwen3-4b", hidden=2560, layers=36, ffn=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                   tied=True),
    TargetGeometry("qwen3-8b", hidden=4096, layers=36, ffn=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                   tied=False),
    TargetGeometry("qwen3.5-tiny", hidden=256, layers=8, ffn=512, heads=2, kv_heads=1, head_dim=256, vocab=2048,
                   tied=False, rope_theta=1e7, linear_key_heads=2, linear_value_heads=4, linear_head_dim=64, mtp=1,
                   note="smoke run"),
    TargetGeometry("qwen3.5-2b", hidden=2048, layers=24, ffn=6144, heads=8, kv_heads=2, head_dim=256, vocab=248320,
                   tied=True, rope_theta=1e7, linear_key_heads=16, linear_value_heads=16, mtp=1,
                   note="a small Qwen3.5 (Qwen3.5-2B's widths as published: unverified)"),
    TargetGeometry("qwen3.5-9b", hidden=4096, layers=32, ffn=12288, heads=16, kv_heads=4, head_dim=256, vocab=248320,
                   tied=False, rope_theta=1e7, linear_key_heads=16, linear_value_heads=32, mtp=1,
                   note="Qwen3.5-9B's text model"),
    # Qwen3.5-27B / Qwen3.6-27B's text model, the DFlash 2 article's Qwen3.8-27B as far as it is public (its
    # config is not): 64 layers, three Gated DeltaNet layers to one full-attention layer, hidden 5120, MLP 17408,
    # full attention 24 query heads and 4 key/value heads of 256, Gated DeltaNet 16 key heads and 48 value heads
    # of 128, vocabulary 248320, untied head, one MTP layer (public model cards and config transcriptions; the
    # linear heads from the 27.8 B parameters of its 55.56 GB bf16 checkpoint, vision and MTP included)
    TargetGeometry("qwen3.5-27b", hidden=5120, layers=64, ffn=17408, heads=24, kv_heads=4, head_dim=256, vocab=248320,
                   tied=False, rope_theta=1e7, linear_key_heads=16, linear_value_heads=48, mtp=1,
                   note="Qwen3.5-27B's text model (the DFlash 2 article's Qwen3.8-27B geometry as far as it is public)"),
    TargetGeometry("qwen3moe-tiny", hidden=256, layers=4, ffn=768, heads=4, kv_heads=2, head_dim=64, vocab=2048,
                   tied=False, experts=8, experts_per_tok=2, moe_ffn=256, note="smoke run"),
    TargetGeometry("qwen3-30b-a3b", hidden=2048, layers=48, ffn=6144, heads=32, kv_heads=4, head_dim=128,
                   vocab=151936, tied=False, experts=128, experts_per_tok=8, moe_ffn=768,
                   note="Qwen3-30B-A3B / Qwen3-Coder-30B-A3B"),
    Gemma4Geometry("gemma4-tiny", hidden=256, layers=6, ffn=512, heads=4, kv_heads=2, head_dim=128, global_kv_heads=1,
                   global_head_dim=256, vocab=2048, global_every=3, sliding_window=16, note="smoke run"),
    # google/gemma-4-31B-it's text model: 60 layers, every 6th global (10), 32 query heads; sliding layers
    # 16 key/value heads of 256, global ones 4 of 512 with K as V; no shared-KV layers; tied head
    Gemma4Geometry("gemma-4-31b", hidden=5376, layers=60, ffn=21504, heads=32, kv_heads=16, head_dim=256,
                   global_kv_heads=4, global_head_dim=512, vocab=262144, note="Gemma 4 31B's text model"),
    Gemma4Geometry("gemma4moe-tiny", hidden=256, layers=6, ffn=256, heads=4, kv_heads=2, head_dim=128,
                   global_kv_heads=1, global_head_dim=256, vocab=2048, global_every=3, sliding_window=16, experts=16,
                   experts_per_tok=2, moe_ffn=96, note="smoke run: expert rows of 96 fall back as 26B-A4B's of 704 do"),
    # google/gemma-4-26B-A4B-it's text model (its config.json text_config, as public copies of it state it; not
    # in llama.cpp's source, whose loader only names 30 layers LLM_TYPE_26B_A4B): hidden 2816, 30 layers, every
    # 6th global (5), 16 query heads; sliding layers 8 key/value heads of 256 (window 1024), global ones 2 of
    # 512 with K as V (attention_k_eq_v); dense MLP 2112 wide and beside it 128 experts of 704, top 8
    # (top_k_experts); vocab 262144, tied head; no shared-KV layers
    Gemma4Geometry("gemma-4-26b-a4b", hidden=2816, layers=30, ffn=2112, heads=16, kv_heads=8, head_dim=256,
                   global_kv_heads=2, global_head_dim=512, vocab=262144, experts=128, experts_per_tok=8, moe_ffn=704,
                   note="Gemma 4 26B-A4B's text model"),
    # a sliding and a global layer of it (transformers makes a Gemma 4's last layer global): what its experts of
    # 704 cost at run time in each form (benchmarks/lean_memory.py)
    Gemma4Geometry("gemma-4-26b-a4b-2l", hidden=2816, layers=2, ffn=2112, heads=16, kv_heads=8, head_dim=256,
                   global_kv_heads=2, global_head_dim=512, vocab=262144, global_every=2, experts=128,
                   experts_per_tok=8, moe_ffn=704, note="a sliding and a global layer of Gemma 4 26B-A4B"),
    # openai/gpt-oss-20b (its config.json on the hub; ggml-org/gpt-oss-20b-GGUF states the same in gpt-oss.*):
    # 24 layers (GptOssConfig's default, 36, is gpt-oss-120b's), hidden 2880, 64 query heads of 64, 8 key/value
    # heads (GptOssConfig's defaults), 32 experts (the default, 128, is the 120b's) top 4 (default), expert width
    # 2880 (intermediate_size, default), vocabulary 201088 (default: o200k_harmony, padded), sliding window 128
    # on every other layer from the first (defaults; llama.cpp's load_swa_pattern(ml, 2), the converter's
    # add_sliding_window), YaRN factor 32 over 4096 original positions, beta_fast 32 / beta_slow 1, truncate
    # false, rope base 150000, 131072 positions (GptOssConfig's default rope_parameters and
    # max_position_embeddings; the converter writes them as gpt-oss.rope.scaling.*, rope.freq_base and
    # context_length), RMS eps 1e-5 (default), untied head (default)
    GptOssGeometry("gpt-oss-20b", hidden=2880, layers=24, ffn=2880, heads=64, kv_heads=8, head_dim=64, vocab=201088,
                   experts=32, experts_per_tok=4, note="gpt-oss-20b"),
    # 2 and 4 of its layers: what a layer costs at run time, as the difference
    GptOssGeometry("gpt-oss-20b-2l", hidden=2880, layers=2, ffn=2880, heads=64, kv_heads=8, head_dim=64,
                   vocab=201088, experts=32, experts_per_tok=4, note="gpt-oss-20b's first 2 layers"),
    GptOssGeometry("gpt-oss-20b-4l", hidden=2880, layers=4, ffn=2880, heads=64, kv_heads=8, head_dim=64,
                   vocab=201088, experts=32, experts_per_tok=4, note="gpt-oss-20b's first 4 layers"),
    GptOssGeometry("gpt-oss-tiny", hidden=64, layers=4, ffn=64, heads=2, kv_heads=1, head_dim=32, vocab=2048,
                   experts=8, experts_per_tok=2, sliding_window=8, rope_factor=8.0, original_context=64,
                   context_length=1024, note="smoke run"),
    # google/gemma-4-E4B-it's text model, from MaxText's configs/models/gemma4-e4b.yml (AI-Hypercomputer/maxtext):
    # 42 layers, hidden 2560, MLP 10240, 8 query heads and 2 key/value heads of 256 (sliding) or 512 (global,
    # no K as V: the E models have v_proj everywhere), window 512, per-layer inputs of 256 over the 262144-token
    # vocabulary, the last 18 layers sharing keys and values, no double-wide MLP (E2B has it). Every 6th layer
    # global, from memory, and consistent with exllamav3's E4B notes (sliding layers share layer 22's keys and
    # values, global ones layer 23's); tied head
    Gemma4Geometry("gemma-4-e4b", hidden=2560, layers=42, ffn=10240, heads=8, kv_heads=2, head_dim=256,
                   global_kv_heads=2, global_head_dim=512, vocab=262144, sliding_window=512, k_eq_v=False,
                   shared_kv_layers=18, per_layer_input=256, note="Gemma 4 E4B's text model"),
    Gemma4Geometry("gemma4-ple-tiny", hidden=256, layers=6, ffn=512, heads=4, kv_heads=2, head_dim=128,
                   global_kv_heads=2, global_head_dim=256, vocab=2048, global_every=3, sliding_window=16,
                   k_eq_v=False, shared_kv_layers=3, per_layer_input=256, note="smoke run"),
]}


def _bf16_pool(rng, n: int) -> np.ndarray:
    values = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
    return (values >> 16).astype(np.uint16)


def _tensor_bytes(name: str, shape, pool: np.ndarray, rng) -> bytes:
    n = math.prod(shape)
    if len(shape) == 1:  # norms: 1 + 0.05 N(0, 1)
        values = (1 + 0.05 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32).view(np.uint32)
        return (values >> 16).astype(np.uint16).tobytes()
    start = int(rng.integers(0, len(pool)))
    reps = -(-(start + n) // len(pool))
    return np.tile(pool, reps)[start:start + n].tobytes() if reps > 1 else pool[start:start + n].tobytes()


def _write_shard(path: Path, tensors: list[tuple[str, tuple]], pool, rng) -> None:
    header, offset = {}, 0
    for name, shape in tensors:
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape in tensors:
            f.write(_tensor_bytes(name, shape, pool, rng))


def write_tokenizer(out: Path, vocab: int) -> None:
    data = json.loads((FIXTURE_TARGET / "tokenizer.json").read_text())
    table = data["model"]["vocab"]
    for i in range(len(table), vocab):
        table[f"x{i}"] = i  # unreachable by the merges: decodes, never encoded
    (out / "tokenizer.json").write_text(json.dumps(data))
    for name in ("tokenizer_config.json", "generation_config.json"):
        shutil.copy(FIXTURE_TARGET / name, out / name)


def write_checkpoint(geom: TargetGeometry, out: Path, seed: int = 0) -> Path:
    """The random bf16 checkpoint of `geom` in `out` (sharded safetensors, config, tokenizer)."""
    rng = np.random.default_rng(seed)
    pool = _bf16_pool(rng, 1 << 24)
    out.mkdir(parents=True, exist_ok=True)
    shapes = geom.shapes()
    shards, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = 2 * math.prod(shape)
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    shards.append(current)
    index = {"metadata": {"total_size": sum(2 * math.prod(s) for s in shapes.values())}, "weight_map": {}}
    for k, tensors in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(out / fname, tensors, pool, rng)
        index["weight_map"].update({name: fname for name, _ in tensors})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(geom.config(), indent=2))
    write_tokenizer(out, geom.vocab)
    return out


def ensure_checkpoint(geom: TargetGeometry, cache: Path = CACHE) -> Path:
    path = cache / f"target-{geom.name}-{geom.key()}" / "hf"
    if not (path.parent / "done").is_file():
        shutil.rmtree(path.parent, ignore_errors=True)
        start = time.perf_counter()
        write_checkpoint(geom, path)
        (path.parent / "done").write_text(f"{time.perf_counter() - start:.1f} s\n")
    return path


# optimum-cli flags of the exports measured (the guide's: int4, group 128, every weight int4 but the head)
EXPORTS = {"int4": ["--weight-format", "int4", "--group-size", "128", "--ratio", "1.0"],
           "int8": ["--weight-format", "int8"], "fp16": ["--weight-format", "fp16"]}


def optimum_export(hf: Path, label: str, time_file: Path | None = None) -> Path:
    """optimum-cli's export of the checkpoint (cached beside it); `time_file`: /usr/bin/time's figures."""
    out = hf.parent / f"optimum-{label}"
    if not (out / "openvino_model.xml").is_file():
        cli = Path(sys.executable).with_name("optimum-cli")
        argv = [str(cli), "export", "openvino", "-m", str(hf), "--task", "text-generation-with-past", *EXPORTS[label],
                str(out)]
        if time_file is not None:
            argv = ["/usr/bin/time", "-f", "%e %M", "-o", str(time_file), *argv]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("geometry", choices=sorted(GEOMETRIES))
    p.add_argument("--export", choices=sorted(EXPORTS))
    args = p.parse_args(argv)
    hf = ensure_checkpoint(GEOMETRIES[args.geometry])
    print(hf)
    if args.export:
        print(optimum_export(hf, args.export))
    return 0


if __name__ == "__main__":
    sys.exit(main())
