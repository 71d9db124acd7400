"""Softmax attention over a cached key/value state, full or sliding: transformers 5.5.4's
LlamaAttention and its Qwen2/Qwen3/Gemma 3 variants (biases, q/k norms, a query pre-scale, a
sliding window), in optimum-intel 2.2.0's op sequence.

One K and one V state variable per layer (`past_key_values.N.keypresent.N.key`, ...), reordered
by `beam_idx`; GQA through repeat_kv's Unsqueeze -> Broadcast -> Reshape and the attention mask in
the op sequence optimum writes, because OpenVINO's SDPAToPagedAttention, which GenAI runs when a
draft attaches, reads the key/value head count and a sliding layer's window from them.
"""

import numpy as np

from ...ir.graph_ops import I64_MAX, apply_rope, const, kv_state, linear, named, repeat_kv
from ...ir.graph_ops import ops as _ops

PAGED_OP = "PagedAttentionExtension"
# The .xml bytes of a decoder layer built of this kind and a dense MLP, weights' decompression aside
# (measured on 4- and 8-layer qwen3 targets: 66.7 KB a layer); what the disk estimate adds.
IR_XML_BYTES = 66_700


def state_name(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}present.{i}.{kind}"


def tensors(c, i: int, q_rows: int = 1, qk_norm: bool | None = None) -> dict[str, tuple[int, ...]]:
    """The layer's attention tensors; `q_rows` query rows a head (2 where a gate rides beside each query)."""
    p = f"model.layers.{i}.self_attn."
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    qk_norm = c.qk_norm if qk_norm is None else qk_norm
    shapes = {}

    def linear_shape(name, out, inp, bias):
        shapes[p + name + ".weight"] = (out, inp)
        if bias:
            shapes[p + name + ".bias"] = (out,)

    linear_shape("q_proj", q_rows * q, h, c.q_bias)
    if qk_norm:
        shapes[p + "q_norm.weight"] = (hd,)
    linear_shape("k_proj", kv, h, c.q_bias)
    if qk_norm:
        shapes[p + "k_norm.weight"] = (hd,)
    linear_shape("v_proj", kv, h, c.q_bias)
    linear_shape("o_proj", h, q, c.attention_bias)
    return shapes


def build(g, x, i: int):
    c = g.config
    p = f"model.layers.{i}.self_attn."
    q = project(g, x, p + "q_proj", c.num_heads)
    if c.qk_norm:
        q = g.norm(q, p + "q_norm.weight", p + "q_norm")
    k = project(g, x, p + "k_proj", c.num_kv_heads)
    if c.qk_norm:
        k = g.norm(k, p + "k_norm.weight", p + "k_norm")
    v = project(g, x, p + "v_proj", c.num_kv_heads)
    q, k, v = (heads_first(t) for t in (q, k, v))
    layer_type = c.layer_types[i]
    q, k = rotate(g, q, k, layer_type)
    attn = attend(g, q, k, v, p, state_name(i, "key"), state_name(i, "value"),
                  c.sliding_window if layer_type == "sliding_attention" else None)
    return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", c.attention_bias))


# --- the pieces, shared with the other attention kinds ---------------------------------------------

def project(g, x, scope: str, count: int, width: int | None = None):
    """A q/k/v projection as [B, L, count, width] (width: the head size)."""
    ops, c = _ops(), g.config
    y = linear(x, g.weight(scope + ".weight"), scope, g.bias(scope + ".bias", c.q_bias))
    return ops.reshape(y, const([0, 0, count, width or c.head_dim], np.int64), True)


def heads_first(x):  # [B, L, H, d] -> [B, H, L, d]
    return _ops().transpose(x, const([0, 2, 1, 3], np.int64))


def rotate(g, q, k, layer_type: str):
    """q and k [B, H, L, head_dim] turned by the layer type's RoPE (NeoX halves) from `position_ids`; a
    table narrower than the head turns its first dimensions only (partial rotary), the rest pass."""
    cos, sin = g.rope(layer_type)
    rotary = 2 * g.config.rope[layer_type][0].size
    return _partial_rope(q, cos, sin, rotary, g.config.head_dim), _partial_rope(k, cos, sin, rotary, g.config.head_dim)


def _partial_rope(x, cos, sin, rotary: int, head_dim: int):
    if rotary == head_dim:
        return apply_rope(x, cos, sin, head_dim // 2)
    ops = _ops()

    def part(start, stop):
        return ops.slice(x, const([start], np.int64), const([stop], np.int64), const([1], np.int64),
                         const([3], np.int64))

    return ops.concat([apply_rope(part(0, rotary), cos, sin, rotary // 2), part(rotary, I64_MAX)], -1)


def attend(g, q, k, v, p: str, key_state: str, value_state: str, window: int | None):
    """SDPA of q over the cached keys and values (state variables `key_state`, `value_state`, their
    Assigns added to the graph's sinks), as [B, L, heads * head_dim]; `window` for a sliding layer."""
    ops, c = _ops(), g.config
    heads, kv_heads, hd = c.num_heads, c.num_kv_heads, c.head_dim
    keys, assign_k = kv_state(k, g.batch, key_state, kv_heads, hd, g.beam_idx)
    values, assign_v = kv_state(v, g.batch, value_state, kv_heads, hd, g.beam_idx)
    g.sinks += [assign_k, assign_v]
    # the cached length as optimum reads it: the first attention layer's key state
    mask = g.mask(window, past_len=keys.input_value(0).get_node())
    keys = repeat_kv(keys, kv_heads, heads // kv_heads, hd)
    values = repeat_kv(values, kv_heads, heads // kv_heads, hd)
    attn = named(ops.scaled_dot_product_attention(q, keys, values, mask, const(c.attention_scale), causal=False),
                 f"__module.{p[:-1]}/aten::scaled_dot_product_attention/ScaledDotProductAttention")
    return ops.reshape(heads_first(attn), const([0, 0, heads * hd], np.int64), True)


def states(c, i: int) -> list[str]:
    return [state_name(i, "key"), state_name(i, "value")]


def paged(c, i: int) -> dict:
    """One paged attention with the config's key/value heads, head size and window (0: full)."""
    window = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
    return {"op": PAGED_OP, "heads": [c.num_kv_heads, c.head_dim], "window": window}
