"""Gated full attention, the softmax layers of Qwen3.5's hybrid decoders: transformers 5.5.4's
Qwen3_5Attention, built from the attention pieces (`pieces.py`).

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
from .kind import LayerKind
from .pieces import (PAGED_ATTENTION, attend, attention_names, attention_tensors, cache_state, heads_first,
                     layer_prefix, ordinal, project, rotate)


class GatedAttention(LayerKind, name="gated_attention", role="mixer"):
    # a gated attention layer with a dense MLP, weights' decompression aside (measured on 4- and 8-layer
    # qwen3_5_text targets, L L L F and L F L F)
    IR_XML_BYTES = 79_100

    def tensors(self, c, i):
        # per head [q_h | gate_h], always q/k-normed
        return attention_tensors(c, layer_prefix(i) + "self_attn.", 2, True, c.attention_bias, c.attention_bias)

    def names(self, options):
        return attention_names(True, False)

    def build(self, g, x, i):
        ops, c = _ops(), g.config
        heads, hd = c.num_heads, c.head_dim
        p = layer_prefix(i) + "self_attn."
        a_ = f"__module.{p[:-1]}/aten::"
        j = ordinal(c, i)

        both = project(g, x, p + "q_proj", heads, 2 * hd, c.attention_bias)             # [B, L, heads, 2 hd]
        q, gate = ops.variadic_split(both, const(-1, np.int64), const([hd, hd], np.int64)).outputs()
        gate = ops.reshape(gate, const([0, 0, heads * hd], np.int64), True)
        q = g.norm(q, p + "q_norm.weight", p + "q_norm")
        k = g.norm(project(g, x, p + "k_proj", c.num_kv_heads, bias=c.attention_bias), p + "k_norm.weight",
                   p + "k_norm")
        v = project(g, x, p + "v_proj", c.num_kv_heads, bias=c.attention_bias)
        q, k, v = (heads_first(t) for t in (q, k, v))
        q, k = rotate(g, q, k, c.layer_types[i])
        attn = attend(g, q, k, v, p, cache_state(j, "key"), cache_state(j, "value"), None)
        attn = named(ops.multiply(attn, named(ops.sigmoid(gate), a_ + "sigmoid/Sigmoid")), a_ + "mul/Multiply_6")
        return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", c.attention_bias))

    def states(self, c, i):
        j = ordinal(c, i)
        return [cache_state(j, "key"), cache_state(j, "value")]

    def paged(self, c, i):
        """One paged attention with the config's key/value heads and head size, no window."""
        return [{"op": PAGED_ATTENTION, "heads": [c.num_kv_heads, c.head_dim], "window": 0}]
