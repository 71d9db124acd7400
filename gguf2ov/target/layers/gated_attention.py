"""Gated full attention, the softmax layers of Qwen3.5's hybrid decoders: transformers 5.5.4's
Qwen3_5Attention, built from `attention.py`'s pieces.

q_proj makes 2 * head_dim rows per head, the head's query then its output gate ([q_h | gate_h]);
q and k are RMSNormed per head (the model's norm form: 1 + w), turned by RoPE from `position_ids`
on their first `partial_rotary_factor * head_dim` dimensions (NeoX halves; for text the interleaved
mRoPE's three position streams are one, so it is plain RoPE), attend over the cached keys and values
with GQA, and the output is multiplied by sigmoid(gate) before o_proj.

K and V state variables named as optimum-intel 2.2.0 names this model's
(`cache_params.past.key.{f}cache_params.present.key.{f}`, numbered by full-attention layer).
optimum's own export turns RoPE by positions it counts from the key cache, which after GenAI's
paged conversion gives every token of a step the same position; RoPE here reads `position_ids`.
"""

import numpy as np

from ...ir.graph_ops import const, linear, named
from ...ir.graph_ops import ops as _ops
from . import attention
from .gated_deltanet import state_name

# The .xml bytes of a gated attention layer with a dense MLP, weights' decompression aside (measured on 4- and
# 8-layer qwen3_5_text targets, L L L F and L F L F); what the disk estimate adds.
IR_XML_BYTES = 79_100

PAGED_OP = attention.PAGED_OP


def ordinal(c, i: int) -> int:
    return c.mixers[:i].count(c.mixers[i])


def tensors(c, i: int) -> dict[str, tuple[int, ...]]:
    return attention.tensors(c, i, q_rows=2, qk_norm=True)  # per head [q_h | gate_h], always q/k-normed


def build(g, x, i: int):
    ops, c = _ops(), g.config
    heads, hd = c.num_heads, c.head_dim
    p = f"model.layers.{i}.self_attn."
    a_ = f"__module.{p[:-1]}/aten::"
    j = ordinal(c, i)

    both = attention.project(g, x, p + "q_proj", heads, 2 * hd)                       # [B, L, heads, 2 hd]
    q, gate = ops.variadic_split(both, const(-1, np.int64), const([hd, hd], np.int64)).outputs()
    gate = ops.reshape(gate, const([0, 0, heads * hd], np.int64), True)
    q = g.norm(q, p + "q_norm.weight", p + "q_norm")
    k = g.norm(attention.project(g, x, p + "k_proj", c.num_kv_heads), p + "k_norm.weight", p + "k_norm")
    v = attention.project(g, x, p + "v_proj", c.num_kv_heads)
    q, k, v = (attention.heads_first(t) for t in (q, k, v))
    q, k = attention.rotate(g, q, k, c.layer_types[i])
    attn = attention.attend(g, q, k, v, p, state_name(j, "key"), state_name(j, "value"), None)
    attn = named(ops.multiply(attn, named(ops.sigmoid(gate), a_ + "sigmoid/Sigmoid")), a_ + "mul/Multiply_6")
    return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", c.attention_bias))


def states(c, i: int) -> list[str]:
    j = ordinal(c, i)
    return [state_name(j, "key"), state_name(j, "value")]


def paged(c, i: int) -> dict:
    """One paged attention with the config's key/value heads and head size, no window."""
    return {"op": PAGED_OP, "heads": [c.num_kv_heads, c.head_dim], "window": 0}
