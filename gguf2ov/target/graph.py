"""The stateful decoder-only LM graph of a DFlash target, built with OpenVINO's opset weight by weight.

optimum-intel exports a target by tracing the whole model in PyTorch (an 8B model: 6-9 GB of RAM
from its bf16 checkpoint). This module writes the same graph from the config alone and asks a
`weight(name)` callable for each weight as it goes (as draft_graph.py does for drafts), so each
weight arrives in its variant's form (float32, float16, NNCF codes, the GGUF's own grid) and is
made only while the IR is written.

The graph is what optimum-intel 2.2.0 writes for `text-generation-with-past` (the reference in
tests/test_target_graph.py: interface, state variables, rt_info, and logits and hidden states over
two stateful steps):
- inputs `input_ids`, `attention_mask`, `position_ids`, `beam_idx`; output `logits`; one K and
  one V state variable per layer (`past_key_values.N.keypresent.N.key`, ...), reordered by
  `beam_idx`;
- transformers 5.5.4's forward for qwen3, llama, qwen2 and gemma3 (target_source._FORWARD);
- the attention mask as transformers builds it (causal, padding and, in sliding layers, the window
  `kv > q - window`) in optimum's op sequence: OpenVINO's SDPAToPagedAttention, which GenAI runs on
  a target with a draft attached, reads a sliding layer's window from that sequence
  (Add(q, -window) -> Greater -> four BitwiseAnds -> Broadcast -> Select) and the key/value head
  count from repeat_kv's Unsqueeze;
- rt_info `hidden_states_decoder_layers` in optimum's convention (layers 0..N-2: each decoder
  layer's residual output; N-1: the final norm's output), which optimum writes for qwen3 only and
  which DFlash needs in GenAI for any target, and the `runtime_options` optimum writes;
- node names where GenAI and this project look nodes up: the embedding table's data node carries
  `embed_tokens` (GenAI's find_embedding_gather, when the vocabulary is small), the head is
  `__module.lm_head/aten::linear/MatMul` feeding the output (through the Divide -> Tanh ->
  Multiply softcap where a config has one: GenAI's find_llm_matmul), Linears and the embedding
  lookup have optimum's float32 export names (`aten::linear/MatMul`, `aten::embedding/Gather`,
  which irweights reads weights back by).
"""

import json
from collections.abc import Callable

import numpy as np

from ..names import LOCATORS_KEY
from ..ir.graph_ops import apply_rope, const, dim, kv_state, linear, named, repeat_kv, rms_norm, rope_tables
from ..ir.graph_ops import ops as _ops
from .source import EMBEDDING, LM_HEAD, TargetConfig, TargetSource
from ..ir.variants import VARIANT_RT_INFO

# optimum's mask fills hidden positions with float16's lowest value, not float32's (patching_utils.py
# eager_mask_without_vmap): exp() of either is 0 in float32
MASKED = float(np.finfo(np.float16).min)


def _state_name(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}present.{i}.{kind}"


class _Masks:
    """The additive attention masks [B, 1, q, kv] of a forward, as transformers' sdpa_mask builds them
    (under optimum's patch): one for full-attention layers, one for sliding layers."""

    def __init__(self, attention_mask, past_len, q_len, batch):
        ops = _ops()
        total = ops.add(past_len, q_len)
        zero, one = const(0, np.int64), const(1, np.int64)

        def scalar(x):
            return ops.squeeze(x, const([0], np.int64))

        kv_idx = ops.range(zero, scalar(total), one, "i64")
        self.kv_idx = ops.reshape(kv_idx, const([1, 1, 1, -1], np.int64), False)  # [1, 1, 1, kv]
        q_idx = ops.add(ops.range(zero, scalar(q_len), one, "i64"), scalar(past_len))
        self.q_idx = ops.reshape(q_idx, const([1, 1, -1, 1], np.int64), False)  # [1, 1, q, 1]
        self.causal = named(ops.less_equal(self.kv_idx, self.q_idx), "__module.model/aten::le/LessEqual")
        padding = ops.convert(attention_mask, "boolean")
        self.padding = ops.unsqueeze(padding, const([1, 2], np.int64))  # [B, 1, 1, kv]
        self.shape = ops.concat([batch, const([1], np.int64), q_len, total], 0)
        self._made = {}

    def for_window(self, window: int | None):
        if window not in self._made:
            self._made[window] = self._mask(window)
        return self._made[window]

    def _mask(self, window):
        ops = _ops()
        true = const(True, np.bool_)
        if window:
            # sliding_window_overlay: kv > q - window, and-ed with causal and padding in this order
            inside = ops.greater(self.kv_idx, ops.add(self.q_idx, const([[[[-window]]]], np.int64)))
            allowed = ops.bitwise_and(ops.bitwise_and(true, inside), self.causal)
            allowed = ops.bitwise_and(true, allowed)
        else:
            allowed = ops.bitwise_and(true, self.causal)
        allowed = ops.broadcast(ops.bitwise_and(allowed, self.padding), self.shape)
        return ops.select(allowed, const(0.0), const(MASKED))


def build_target_model(config: TargetConfig, weight: Callable[[str], object], vector: Callable[[str], np.ndarray],
                       progress: Callable[[str], None] | None = None):
    """(the stateful target `ov.Model`, its hidden-state locators {layer: {producer, output_index}}).

    `weight(name)` returns the float32 output for a Linear weight or the embedding table (a
    Constant or a decompression subgraph); `vector(name)` the float32 values of a norm weight or a
    bias. Each is called once per tensor, in graph order (target_source.target_tensor_shapes), so
    a caller can stream and free each source tensor.
    """
    import openvino as ov

    ops = _ops()
    c = config
    heads, kv_heads, hd, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps

    input_ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], np.int64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], np.int64, name="position_ids")
    beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
    params = [input_ids, attention_mask, position_ids, beam_idx]
    for p in params:
        p.output(0).get_tensor().set_names({p.get_friendly_name()})

    def norm(x, name: str, scope: str):
        w = vector(name)
        return rms_norm(x, w + np.float32(c.norm_offset) if c.norm_offset else w, eps, scope)

    def bias(name: str, present: bool):
        return vector(name) if present else None

    table = weight(EMBEDDING)
    if "embed_tokens" not in table.get_node().get_friendly_name():
        # GenAI finds the embedding by its table's size or, below 1000 rows, by this name
        table.get_node().set_friendly_name(f"self.{EMBEDDING}/decompressed")
    scope = "__module.model.embed_tokens/aten::"
    ids = named(ops.convert(input_ids, "i32"), scope + "embedding/Convert")
    x = named(ops.gather(table, ids, const(0, np.int64)), scope + "embedding/Gather")
    if c.embedding_scale is not None:
        x = named(ops.multiply(x, const(c.embedding_scale)), scope + "mul/Multiply")

    batch, q_len = dim(input_ids, 0), dim(input_ids, 1)
    rope = {t: rope_tables(position_ids, *c.rope[t]) for t in sorted(set(c.layer_types))}
    masks, sinks, locators = None, [], {}
    for i in range(c.num_layers):
        if progress:
            progress(f"layer {i + 1}/{c.num_layers}")
        p = s = f"model.layers.{i}."  # tensor names and node scopes alike
        layer_type = c.layer_types[i]
        residual = x
        normed = norm(x, p + "input_layernorm.weight", s + "input_layernorm")

        def projected(name, count):  # [B, L, count, head_dim]
            y = linear(normed, weight(p + f"self_attn.{name}.weight"), s + f"self_attn.{name}",
                       bias(p + f"self_attn.{name}.bias", c.q_bias))
            return ops.reshape(y, const([0, 0, count, hd], np.int64), True)

        q = projected("q_proj", heads)
        if c.qk_norm:
            q = norm(q, p + "self_attn.q_norm.weight", s + "self_attn.q_norm")
        k = projected("k_proj", kv_heads)
        if c.qk_norm:
            k = norm(k, p + "self_attn.k_norm.weight", s + "self_attn.k_norm")
        v = projected("v_proj", kv_heads)
        q, k, v = (ops.transpose(t, const([0, 2, 1, 3], np.int64)) for t in (q, k, v))
        cos, sin = rope[layer_type]
        q, k = apply_rope(q, cos, sin, hd // 2), apply_rope(k, cos, sin, hd // 2)
        keys, assign_k = kv_state(k, batch, _state_name(i, "key"), kv_heads, hd, beam_idx)
        values, assign_v = kv_state(v, batch, _state_name(i, "value"), kv_heads, hd, beam_idx)
        sinks += [assign_k, assign_v]
        if masks is None:  # the cached length as optimum reads it: the first layer's key state
            masks = _Masks(attention_mask, dim(keys.input_value(0).get_node(), 2), q_len, batch)
        mask = masks.for_window(c.sliding_window if layer_type == "sliding_attention" else None)
        keys = repeat_kv(keys, kv_heads, heads // kv_heads, hd)
        values = repeat_kv(values, kv_heads, heads // kv_heads, hd)
        attn = named(ops.scaled_dot_product_attention(q, keys, values, mask, const(c.attention_scale), causal=False),
                     f"__module.{s}self_attn/aten::scaled_dot_product_attention/ScaledDotProductAttention")
        attn = ops.reshape(ops.transpose(attn, const([0, 2, 1, 3], np.int64)), const([0, 0, heads * hd], np.int64), True)
        attn = linear(attn, weight(p + "self_attn.o_proj.weight"), s + "self_attn.o_proj",
                      bias(p + "self_attn.o_proj.bias", c.attention_bias))
        if c.sandwich_norms:
            attn = norm(attn, p + "post_attention_layernorm.weight", s + "post_attention_layernorm")
        x = named(ops.add(residual, attn), f"__module.{s[:-1]}/aten::add/Add")

        residual = x
        second = "pre_feedforward_layernorm" if c.sandwich_norms else "post_attention_layernorm"
        normed = norm(x, p + second + ".weight", s + second)
        gate = linear(normed, weight(p + "mlp.gate_proj.weight"), s + "mlp.gate_proj",
                      bias(p + "mlp.gate_proj.bias", c.mlp_bias))
        if c.activation == "silu":
            gate = named(ops.swish(gate), f"__module.{s}mlp.act_fn/aten::silu/Swish")
        else:
            gate = named(ops.gelu(gate, "tanh"), f"__module.{s}mlp.act_fn/aten::gelu/Gelu")
        up = linear(normed, weight(p + "mlp.up_proj.weight"), s + "mlp.up_proj", bias(p + "mlp.up_proj.bias", c.mlp_bias))
        mlp = linear(named(ops.multiply(gate, up), f"__module.{s}mlp/aten::mul/Multiply"),
                     weight(p + "mlp.down_proj.weight"), s + "mlp.down_proj", bias(p + "mlp.down_proj.bias", c.mlp_bias))
        if c.sandwich_norms:
            mlp = norm(mlp, p + "post_feedforward_layernorm.weight", s + "post_feedforward_layernorm")
        x = named(ops.add(residual, mlp), f"__module.{s[:-1]}/aten::add/Add_1")
        if i < c.num_layers - 1:
            locators[i] = x

    x = norm(x, "model.norm.weight", "model.norm")
    locators[c.num_layers - 1] = x
    logits = linear(x, table if c.tie_word_embeddings else weight(LM_HEAD), "lm_head")
    if c.final_logit_softcapping is not None:
        cap = const(c.final_logit_softcapping)
        logits = named(ops.tanh(named(ops.divide(logits, cap), "aten::div/Divide")), "aten::tanh/Tanh")
        logits = named(ops.multiply(logits, cap), "aten::mul/Multiply")
    result = ops.result(logits)
    result.output(0).get_tensor().set_names({"logits"})
    model = ov.Model([result], sinks, params, "target")
    return model, {i: {"producer": node.get_friendly_name(), "output_index": 0} for i, node in locators.items()}


# --- the target IR of a variant: built, annotated -------------------------------------------------

def set_target_rt_info(model, locators: dict, variant) -> None:
    """The rt_info optimum writes for `text-generation-with-past`, and which GenAI reads: the
    hidden-state locators, and `runtime_options` (activations scaled by 8 on fp16 devices; an f16
    KV cache unless the weights are compressed, as optimum decides with `quantized_model`)."""
    layers = {str(i): loc for i, loc in sorted(locators.items())}
    model.set_rt_info(json.dumps({"layers": layers}, separators=(",", ":")), LOCATORS_KEY)
    model.set_rt_info("8.0", ["runtime_options", "ACTIVATIONS_SCALE_FACTOR"])
    if variant.format.compressed is False:
        model.set_rt_info("f16", ["runtime_options", "KV_CACHE_PRECISION"])
    model.set_rt_info(variant.name, list(VARIANT_RT_INFO))
    if variant.format.annotate is not None:
        variant.format.annotate(model, variant)


def target_forms(source: TargetSource, variant, compact_grid: bool = False):
    """The WeightForms of a target: streamed while the IR is written, `gguf` weights folded (the form
    the CPU plugin runs without private copies, gguf/transcode.py) unless `compact_grid`."""
    from ..ir.weights import WeightForms

    return WeightForms(source, variant, streamed=True, folded_grid=not compact_grid)


def build_target_ir(source: TargetSource, variant, progress: Callable[[str], None] | None = None, forms=None):
    """The target `ov.Model` of `variant` (not yet saved; its weights are made while it is saved).
    Returns (model, weight forms); `forms`: the WeightForms made for it already (its NNCF plan
    checked), else `target_forms`."""
    forms = forms or target_forms(source, variant)
    model, locators = build_target_model(source.config, forms.weight, forms.vector, progress=progress)
    set_target_rt_info(model, locators, variant)
    return model, forms
