"""Softmax attention over a cached key/value state, full or sliding: transformers 5.5.4's
LlamaAttention and its Qwen2/Qwen3/Gemma 3 variants (biases, q/k norms, a query pre-scale, a
sliding window), in optimum-intel 2.2.0's op sequence.

One K and one V state variable per layer (`past_key_values.N.keypresent.N.key`, ...), reordered
by `beam_idx`; GQA through repeat_kv's Unsqueeze -> Broadcast -> Reshape and the attention mask in
the op sequence optimum writes, because OpenVINO's SDPAToPagedAttention, which GenAI runs when a
draft attaches, reads the key/value head count and a sliding layer's window from them.
"""

import numpy as np

from ...ir.graph_ops import apply_rope, const, kv_state, linear, named, repeat_kv
from ...ir.graph_ops import ops as _ops

PAGED_OP = "PagedAttentionExtension"
# The .xml bytes of a decoder layer built of this kind and a dense MLP, weights' decompression aside
# (measured on 4- and 8-layer qwen3 targets: 66.7 KB a layer); what the disk estimate adds.
IR_XML_BYTES = 66_700


def state_name(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}present.{i}.{kind}"


def tensors(c, i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}.self_attn."
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    shapes = {}

    def linear_shape(name, out, inp, bias):
        shapes[p + name + ".weight"] = (out, inp)
        if bias:
            shapes[p + name + ".bias"] = (out,)

    linear_shape("q_proj", q, h, c.q_bias)
    if c.qk_norm:
        shapes[p + "q_norm.weight"] = (hd,)
    linear_shape("k_proj", kv, h, c.q_bias)
    if c.qk_norm:
        shapes[p + "k_norm.weight"] = (hd,)
    linear_shape("v_proj", kv, h, c.q_bias)
    linear_shape("o_proj", h, q, c.attention_bias)
    return shapes


def build(g, x, i: int):
    ops, c = _ops(), g.config
    heads, kv_heads, hd = c.num_heads, c.num_kv_heads, c.head_dim
    p = f"model.layers.{i}.self_attn."

    def projected(name, count):  # [B, L, count, head_dim]
        y = linear(x, g.weight(p + name + ".weight"), p + name, g.bias(p + name + ".bias", c.q_bias))
        return ops.reshape(y, const([0, 0, count, hd], np.int64), True)

    q = projected("q_proj", heads)
    if c.qk_norm:
        q = g.norm(q, p + "q_norm.weight", p + "q_norm")
    k = projected("k_proj", kv_heads)
    if c.qk_norm:
        k = g.norm(k, p + "k_norm.weight", p + "k_norm")
    v = projected("v_proj", kv_heads)
    q, k, v = (ops.transpose(t, const([0, 2, 1, 3], np.int64)) for t in (q, k, v))
    layer_type = c.layer_types[i]
    cos, sin = g.rope(layer_type)
    q, k = apply_rope(q, cos, sin, hd // 2), apply_rope(k, cos, sin, hd // 2)
    keys, assign_k = kv_state(k, g.batch, state_name(i, "key"), kv_heads, hd, g.beam_idx)
    values, assign_v = kv_state(v, g.batch, state_name(i, "value"), kv_heads, hd, g.beam_idx)
    g.sinks += [assign_k, assign_v]
    # the cached length as optimum reads it: the first attention layer's key state
    mask = g.mask(c.sliding_window if layer_type == "sliding_attention" else None,
                  past_len=keys.input_value(0).get_node())
    keys = repeat_kv(keys, kv_heads, heads // kv_heads, hd)
    values = repeat_kv(values, kv_heads, heads // kv_heads, hd)
    attn = named(ops.scaled_dot_product_attention(q, keys, values, mask, const(c.attention_scale), causal=False),
                 f"__module.{p[:-1]}/aten::scaled_dot_product_attention/ScaledDotProductAttention")
    attn = ops.reshape(ops.transpose(attn, const([0, 2, 1, 3], np.int64)), const([0, 0, heads * hd], np.int64), True)
    return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", c.attention_bias))


def states(c, i: int) -> list[str]:
    return [state_name(i, "key"), state_name(i, "value")]


def paged(c, i: int) -> dict:
    """One paged attention with the config's key/value heads, head size and window (0: full)."""
    window = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
    return {"op": PAGED_OP, "heads": [c.num_kv_heads, c.head_dim], "window": window}
