"""The pieces several kinds of layer are built from: q/k/v projections into heads, RoPE (whole or
partial), SDPA over a cached key/value state, the gated MLP, and the names optimum gives states.

Each piece writes optimum-intel 2.2.0's op sequence and node names, which OpenVINO's
SDPAToPagedAttention (run by GenAI when a draft attaches) and this project's IR checks read: GQA
through repeat_kv's Unsqueeze -> Broadcast -> Reshape, and the attention mask's op sequence, are
where the paged conversion reads the key/value head count and a sliding layer's window.
"""

from typing import NamedTuple

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import I64_MAX, apply_rope, const, kv_state, linear, named, repeat_kv
from ...ir.graph_ops import ops as _ops

PAGED_ATTENTION = "PagedAttentionExtension"


def layer_prefix(i: int) -> str:
    """Layer `i`'s tensor names and node scopes begin with this."""
    return f"model.layers.{i}."


def ordinal(c, i: int) -> int:
    """Layer `i`'s index among the layers of its mixer kind (optimum numbers a hybrid's states so)."""
    return c.mixers[:i].count(c.mixers[i])


def cache_state(j: int, kind: str) -> str:
    """optimum's variable id for a hybrid model's state (input name + output name): `kind` key, value,
    conv or ssm, `j` the layer's ordinal among its kind."""
    return f"cache_params.past.{kind}.{j}cache_params.present.{kind}.{j}"


# --- attention ----------------------------------------------------------------------------------

class Heads(NamedTuple):
    """An attention's geometry: query heads, key/value heads, head size (a layer type may have its own)."""

    count: int
    kv: int
    size: int


def heads_of(c) -> Heads:
    """The config's attention geometry, every layer's unless a kind says otherwise."""
    return Heads(c.num_heads, c.num_kv_heads, c.head_dim)


def project(g, x, scope: str, count: int, width: int | None = None, bias: bool = False):
    """A q/k/v projection as [B, L, count, width] (width: the head size)."""
    y = linear(x, g.weight(scope + ".weight"), scope, g.bias(scope + ".bias", bias))
    return _ops().reshape(y, const([0, 0, count, width or g.config.head_dim], np.int64), True)


def heads_first(x):  # [B, L, H, d] -> [B, H, L, d]
    return _ops().transpose(x, const([0, 2, 1, 3], np.int64))


def rotate(g, q, k, layer_type: str, head_dim: int | None = None):
    """q and k [B, H, L, head_dim] turned by the layer type's RoPE (NeoX halves) from `position_ids`; a
    table narrower than the head turns its first dimensions only (partial rotary), the rest pass.
    `k` None: a layer that reads another layer's keys turns its queries only."""
    cos, sin = g.rope(layer_type)
    rotary, head_dim = 2 * g.config.rope[layer_type][0].size, head_dim or g.config.head_dim
    return (_partial_rope(q, cos, sin, rotary, head_dim),
            None if k is None else _partial_rope(k, cos, sin, rotary, head_dim))


def _partial_rope(x, cos, sin, rotary: int, head_dim: int):
    if rotary == head_dim:
        return apply_rope(x, cos, sin, head_dim // 2)
    ops = _ops()

    def part(start, stop):
        return ops.slice(x, const([start], np.int64), const([stop], np.int64), const([1], np.int64),
                         const([3], np.int64))

    return ops.concat([apply_rope(part(0, rotary), cos, sin, rotary // 2), part(rotary, I64_MAX)], -1)


def attend(g, q, k, v, p: str, key_state: str, value_state: str, window: int | None, geometry: Heads | None = None,
           scale: float | None = None, sinks: np.ndarray | None = None):
    """SDPA of q over the cached keys and values (state variables `key_state`, `value_state`, their
    Assigns added to the graph's sinks), as [B, L, heads * head_dim]; `window` for a sliding layer,
    `geometry` the layer's heads (the config's when None), `scale` the query scale (the config's);
    `sinks`: one learned logit per query head in each softmax's denominator (gpt-oss), SDPA's sixth
    input."""
    geometry = geometry or heads_of(g.config)
    keys, values = cached_kv(g, k, v, key_state, value_state, geometry)
    return attend_cached(g, q, keys, values, p, window, geometry, scale, sinks)


def cached_kv(g, k, v, key_state: str, value_state: str, geometry: Heads):
    """(past + new keys, past + new values) [B, kv heads, past + L, head_dim]: k and v appended to their
    state variables, whose Assigns join the graph's sinks."""
    keys, assign_k = kv_state(k, g.batch, key_state, geometry.kv, geometry.size, g.beam_idx)
    values, assign_v = kv_state(v, g.batch, value_state, geometry.kv, geometry.size, g.beam_idx)
    g.sinks += [assign_k, assign_v]
    return keys, values


def attend_cached(g, q, keys, values, p: str, window: int | None, geometry: Heads, scale: float | None = None,
                  sinks: np.ndarray | None = None):
    """SDPA of q over `keys` and `values` (`cached_kv`'s, this layer's or those of the layer it shares
    them with), as [B, L, heads * head_dim]; `scale` and `sinks` as `attend`'s."""
    ops = _ops()
    heads, kv_heads, hd = geometry
    # the cached length as optimum reads it: the first attention layer's key state
    mask = g.mask(window, past_len=keys.input_value(0).get_node())
    keys = repeat_kv(keys, kv_heads, heads // kv_heads, hd)
    values = repeat_kv(values, kv_heads, heads // kv_heads, hd)
    scale = const(g.config.attention_scale if scale is None else scale)
    scope = f"__module.{p[:-1]}/aten::scaled_dot_product_attention/ScaledDotProductAttention"
    if sinks is None:
        attn = named(ops.scaled_dot_product_attention(q, keys, values, mask, scale, causal=False), scope)
    else:
        attn = named(_sdpa_with_sinks(q, keys, values, mask, scale, sinks), scope)
    return ops.reshape(heads_first(attn), const([0, 0, heads * hd], np.int64), True)


def _sdpa_with_sinks(q, keys, values, mask, scale, sinks: np.ndarray):
    """ScaledDotProductAttention-13 with its sixth input, the sinks as [1, heads, 1, 1]: softmax over the
    scores and the head's sink logit, the sink's share dropped (transformers' eager gpt-oss attention).
    opset13's Python builder takes five inputs; OpenVINO 2026.4.1's SDPAToPagedAttention carries a static
    rank-4 sixth input whose heads are the query's into the paged attention's sinks input."""
    from openvino.utils.node_factory import NodeFactory

    inputs = [x.output(0) if hasattr(x, "output") else x
              for x in (q, keys, values, mask, scale, const(np.asarray(sinks, np.float32).reshape(1, -1, 1, 1)))]
    return NodeFactory("opset13").create("ScaledDotProductAttention", inputs, {"causal": False})


def attention_names(qk_norm: bool, qkv_bias: bool) -> dict[str, bool]:
    """`attention_tensors`' names under the layer prefix: q/k norms as the map's options say, q/k/v biases
    where they say (else as the config's attention_bias says), the o bias as the config says."""
    names = {f"self_attn.{n}_proj.weight": True for n in "qkvo"}
    names |= {f"self_attn.{n}_proj.bias": qkv_bias for n in "qkv"} | {"self_attn.o_proj.bias": False}
    return names | ({"self_attn.q_norm.weight": True, "self_attn.k_norm.weight": True} if qk_norm else {})


def attention_tensors(c, p: str, q_rows: int, qk_norm: bool, q_bias: bool, o_bias: bool,
                      geometry: Heads | None = None) -> dict:
    """The tensors of an attention under scope `p` (`...self_attn.`): q/k/v/o projections (`q_rows` query
    rows a head: 2 where a gate rides beside each query), biases and per-head q/k norms where stated;
    `geometry` the layer's heads (the config's when None)."""
    heads, kv_heads, hd = geometry or heads_of(c)
    h, q, kv = c.hidden_size, heads * hd, kv_heads * hd
    shapes = {}

    def linear_shape(name, out, inp, bias):
        shapes[p + name + ".weight"] = (out, inp)
        if bias:
            shapes[p + name + ".bias"] = (out,)

    linear_shape("q_proj", q_rows * q, h, q_bias)
    if qk_norm:
        shapes[p + "q_norm.weight"] = (hd,)
    linear_shape("k_proj", kv, h, q_bias)
    if qk_norm:
        shapes[p + "k_norm.weight"] = (hd,)
    linear_shape("v_proj", kv, h, q_bias)
    linear_shape("o_proj", h, q, o_bias)
    return shapes


# --- the gated MLP --------------------------------------------------------------------------------

def check_dense_width(c, where) -> None:
    """Refuse a config that states no width for a dense MLP (target_config lets one without it through:
    a mixture-of-experts model has no dense MLP)."""
    if c.intermediate_size <= 0:
        raise Gguf2ovError(f"{where}: intermediate_size is missing: the width of a dense MLP")


def gated_mlp_names(p: str) -> dict[str, bool]:
    """`gated_mlp_tensors`' names under the layer prefix (biases as the config's mlp_bias says)."""
    return {f"{p}{n}_proj.{w}": w == "weight" for n in ("gate", "up", "down") for w in ("weight", "bias")}


def gated_mlp_tensors(p: str, hidden: int, width: int, bias: bool) -> dict:
    """The tensors of down(act(gate(x)) * up(x)) under scope `p` (`...mlp.`), `width` wide."""
    shapes = {}
    for name, out, inp in (("gate_proj", width, hidden), ("up_proj", width, hidden), ("down_proj", hidden, width)):
        shapes[p + name + ".weight"] = (out, inp)
        if bias:
            shapes[p + name + ".bias"] = (out,)
    return shapes


def gated_mlp(g, x, p: str, bias: bool):
    """down(act(gate(x)) * up(x)) under scope `p`, as transformers' LlamaMLP (and Qwen's, Gemma's)
    computes it, act the config's (silu, or Gemma's tanh GeLU)."""
    ops = _ops()

    def project(name, inp):
        return linear(inp, g.weight(p + name + ".weight"), p + name, g.bias(p + name + ".bias", bias))

    gate = activation(g, project("gate_proj", x), f"__module.{p}act_fn/aten::")
    up = project("up_proj", x)
    return project("down_proj", named(ops.multiply(gate, up), f"__module.{p[:-1]}/aten::mul/Multiply"))


def activation(g, x, scope: str):
    """The config's activation of `x` (silu, or Gemma's tanh GeLU), named under `scope` (`__module.<...>/aten::`)."""
    ops = _ops()
    return named(ops.swish(x), scope + "silu/Swish") if g.config.activation == "silu" else \
        named(ops.gelu(x, "tanh"), scope + "gelu/Gelu")


# --- a mixture of experts in the tiled form the CPU plugin rewrites into GatherMatmul (`moe.py`) ------

def route(logits, top_k: int, renormalise: bool, experts: int, s: str, expert_scale: np.ndarray | None = None):
    """The routing weights [E, T, 1] of router `logits` [T, E]: softmax over every expert, the top k
    (renormalised to sum to 1: the softmax of the top k logits), each times its expert's `expert_scale`
    where given (Gemma 4's per_expert_scale), scattered into zeros, as optimum-intel 2.2.0 traces it; `s`
    the block's node scope. The CPU plugin's rewrite takes any weights beside the TopK's indices."""
    ops, i64 = _ops(), np.int64
    probs = named(ops.softmax(logits, -1), f"{s}.gate/aten::softmax/Softmax")
    topk = named(ops.topk(probs, const(top_k, i64), -1, "max", "value", "i64"), f"{s}.gate/aten::topk/TopK")
    chosen, index = topk.output(0), topk.output(1)
    if renormalise:
        total = named(ops.reduce_sum(chosen, const([-1], i64), True), f"{s}.gate/aten::sum/ReduceSum")
        chosen = named(ops.divide(chosen, total), f"{s}.gate/aten::div_/Divide").output(0)
    if expert_scale is not None:
        scale = ops.gather(const(np.asarray(expert_scale, np.float32)), index, const(0, i64))
        chosen = named(ops.multiply(chosen, scale), f"{s}.gate/aten::mul/Multiply").output(0)
    zeros = named(ops.broadcast(const(0.0), ops.shape_of(probs, "i64")), f"{s}.experts/aten::zeros/Broadcast")
    routing = named(ops.scatter_elements_update(zeros, ops.convert(index, "i32"), chosen, const(1, i64)),
                    f"{s}.experts/aten::scatter_/ScatterElementsUpdate")  # [T, E]
    routing = ops.reshape(ops.transpose(routing, const([1, 0], i64)), const([experts, -1], i64), False)
    return ops.unsqueeze(routing, const(-1, i64))


def tile_tokens(flat, experts: int, hidden: int, s: str):
    """Every token [T, H] once for each expert, [E, T, H] (the Tile the plugin's rewrite starts from)."""
    ops, i64 = _ops(), np.int64
    tiled = named(ops.tile(flat, const([experts, 1], i64)), f"{s}.experts/aten::repeat/Tile")
    return named(ops.reshape(tiled, const([experts, -1, hidden], i64), False), f"{s}.experts/aten::view/Reshape")


def expert_mlps(g, flat, routing, p: str, experts: int, hidden: int, s: str):
    """Every expert's down(act(gate(h)) * up(h)) on every token of `flat` [T, H], weighted by `routing`
    [E, T, 1] and summed over the experts: [T, H]. The experts are `p` + gate_proj, up_proj [E, I, H]
    and down_proj [E, H, I] (batched MatMuls, transpose_b), act the config's (silu as a one-input Swish,
    or Gemma's tanh GeLU, Gelu-7: the rewrite takes either on the gate); `s` the block's node scope."""
    ops, i64 = _ops(), np.int64
    tiled = tile_tokens(flat, experts, hidden, s)  # [E, T, H]

    def bmm(inp, name, suffix):
        return named(ops.matmul(inp, g.weight(p + name), False, True), f"{s}.experts/aten::bmm/MatMul{suffix}")

    gate = bmm(tiled, "gate_proj", "")
    scope = f"{s}.experts.act_fn/aten::"
    gate = named(swish(gate), scope + "silu/Swish") if g.config.activation == "silu" else \
        named(ops.gelu(gate, "tanh"), scope + "gelu/Gelu")
    act = named(ops.multiply(gate, bmm(tiled, "up_proj", "_1")), f"{s}.experts/aten::mul/Multiply")
    down = ops.reshape(bmm(act, "down_proj", "_2"), const([experts, -1, hidden], i64), False)
    weighted = named(ops.multiply(down, routing), f"{s}.experts/aten::mul/Multiply_1")
    return named(ops.reduce_sum(weighted, const([0], i64), False), f"{s}.experts/aten::sum/ReduceSum")  # [T, H]


def swish(x, beta: float | None = None):
    """x * sigmoid(beta * x). Without `beta`, Swish with one input, as the PyTorch frontend writes SiLU:
    `opset4.swish` always adds a beta input (Constant 1.0), and ConvertTiledMoeBlockTo3GatherMatmuls
    matches a one-input Swish only; gpt-oss's two-GEMM pattern takes its beta as a Constant input."""
    from openvino.utils.node_factory import NodeFactory

    inputs = [x.output(0) if hasattr(x, "output") else x]
    if beta is not None:
        inputs.append(const(beta).output(0))
    return NodeFactory("opset4").create("Swish", inputs, {})
