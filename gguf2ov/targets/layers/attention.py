"""Softmax attention over a cached key/value state, full or sliding: transformers 5.5.4's
LlamaAttention and its Qwen2/Qwen3/Gemma 3/gpt-oss variants (biases, q/k norms, a query pre-scale, a
sliding window, per-head attention sinks), in optimum-intel 2.2.0's op sequence (`pieces.py`).

One K and one V state variable per layer (`past_key_values.N.keypresent.N.key`, ...), reordered
by `beam_idx`; GenAI's paged conversion makes one paged attention of each layer, with the layer's
window when it slides.
"""

from ...ir.graph_ops import linear
from .kind import LayerKind
from .pieces import (PAGED_ATTENTION, attend, attention_names, attention_tensors, heads_first, layer_prefix, project,
                     rotate)


def _state(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}present.{i}.{kind}"


def _window(c, i: int) -> int | None:
    return c.sliding_window if c.layer_types[i] == "sliding_attention" else None


def _q_bias(c) -> bool:
    return c.attention_bias or c.options["qkv_bias"]


class Attention(LayerKind, name="attention", role="mixer"):
    # a decoder layer built of this kind and a dense MLP, weights' decompression aside (measured on 4- and
    # 8-layer qwen3 targets: 66.7 KB a layer)
    IR_XML_BYTES = 66_700
    # an RMSNorm on each query and key head (Qwen3, Gemma 3); q/k/v biases without an o bias (Qwen2); a
    # learned logit per query head in the softmax's denominator (gpt-oss's `self_attn.sinks`)
    OPTIONS = {"qk_norm": False, "qkv_bias": False, "sinks": False}

    def tensors(self, c, i):
        p = layer_prefix(i) + "self_attn."
        shapes = attention_tensors(c, p, 1, c.options["qk_norm"], _q_bias(c), c.attention_bias)
        if not c.options["sinks"]:
            return shapes
        output = {n: s for n, s in shapes.items() if n.startswith(p + "o_proj.")}  # read after the sinks
        return {n: s for n, s in shapes.items() if n not in output} | {p + "sinks": (c.num_heads,)} | output

    def names(self, options):
        return attention_names(options["qk_norm"], options["qkv_bias"]) | (
            {"self_attn.sinks": True} if options["sinks"] else {})

    def build(self, g, x, i):
        c = g.config
        p = layer_prefix(i) + "self_attn."
        qk_norm, q_bias = c.options["qk_norm"], _q_bias(c)
        q = project(g, x, p + "q_proj", c.num_heads, bias=q_bias)
        if qk_norm:
            q = g.norm(q, p + "q_norm.weight", p + "q_norm")
        k = project(g, x, p + "k_proj", c.num_kv_heads, bias=q_bias)
        if qk_norm:
            k = g.norm(k, p + "k_norm.weight", p + "k_norm")
        v = project(g, x, p + "v_proj", c.num_kv_heads, bias=q_bias)
        q, k, v = (heads_first(t) for t in (q, k, v))
        q, k = rotate(g, q, k, c.layer_types[i])
        sinks = g.vector(p + "sinks") if c.options["sinks"] else None
        attn = attend(g, q, k, v, p, _state(i, "key"), _state(i, "value"), _window(c, i), sinks=sinks)
        return linear(attn, g.weight(p + "o_proj.weight"), p + "o_proj", g.bias(p + "o_proj.bias", c.attention_bias))

    def states(self, c, i):
        return [_state(i, "key"), _state(i, "value")]

    def paged(self, c, i):
        """One paged attention with the config's key/value heads, head size, window (0: full) and sink
        logits (one per query head, or none)."""
        return [{"op": PAGED_ATTENTION, "heads": [c.num_kv_heads, c.head_dim], "window": _window(c, i) or 0,
                 "sinks": c.num_heads if c.options["sinks"] else 0}]
