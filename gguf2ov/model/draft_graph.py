"""The DFlash draft graph built directly with OpenVINO's opset, one weight at a time.

Tracing optimum-intel's `Qwen3DFlashForCausalLM` needs the whole draft as a float32 PyTorch model,
and the traced IR holds it again: 13-17 GB for a 1 B draft. This module writes the same graph from
the config alone and asks a `weight(name)` callable for each Linear weight as it goes, so a weight
can arrive already in the form its variant stores (float32, float16, NNCF codes, the GGUF's own
codes) and nothing else of the draft is in memory.

The graph reproduces optimum-intel 2.2.0's export of that class, which stays the reference
(tests/test_draft_graph.py compares interface, rt_info and outputs):
- inputs `inputs_embeds [?,?,H]`, `hidden_states [?,?,n*H]`, `position_ids`, `attention_mask`,
  `beam_idx`; one output `last_hidden_state` without the seed row;
- context features `hidden_norm(fc(hidden_states))`, shared by all layers;
- per layer, queries from the block rows only, keys and values from [context, block], RoPE over
  all positions, and a K/V state per layer holding the context only (the block is never cached),
  reordered by `beam_idx` like every stateful optimum export;
- attention inside the block both ways, the caller's padding mask, and for sliding layers the
  same window as optimum (the last `sliding_window` cached positions, and a relative window mask);
  where the two differ, z-lab's reference decides: a config without `is_causal` makes its sliding
  layers causal, and a window shorter than the block hides rows after the query too.
A DFlash 2 draft (`config.is_dflash2`) adds the four dynamic depthwise convolutions of each layer
(z-lab's `GroupedDynamicCausalConv`, gguf2ov/dflash2_torch.py): before and after attention, before
and after the MLP. They run along the block rows only (dim 1 of `inputs_embeds`, where GenAI's
DFlash runtime puts them), row 0 reading zero; the context features and the K/V state are those of
v1. The candidate selector is not part of the graph.
Node names follow optimum's (`__module.layers.0.self_attn.q_proj/aten::linear/MatMul`, ...), so
every tool that reads an optimum draft IR by name reads this one too.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..names import CONFIG_FILE, IR_XML, PROVENANCE_FILE
from ..outputs import atomic_write_text
from ..progress import step
from ..provenance import provenance
from .config import DraftConfig
from .variants import VARIANT_RT_INFO, Variant

F32_MIN = float(np.finfo(np.float32).min)


def _ops():
    from openvino import opset13

    return opset13


def _const(values, dtype=np.float32):
    return _ops().constant(np.asarray(values, dtype=dtype))


def _named(node, name: str):
    node.set_friendly_name(name)
    return node


def rms_norm(x, weight: np.ndarray, eps: float, scope: str):
    """Qwen3RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * weight."""
    ops = _ops()
    p = f"__module.{scope}/aten::"
    square = _named(ops.power(x, _const(2.0)), p + "pow/Power")
    mean = _named(ops.reduce_mean(square, _const([-1], np.int64), True), p + "mean/ReduceMean")
    root = _named(ops.sqrt(_named(ops.add(mean, _const(eps)), p + "add/Add")), p + "rsqrt/Sqrt")
    inverse = _named(ops.divide(_const(1.0), root), p + "rsqrt/Divide")
    normed = _named(ops.multiply(x, inverse), p + "mul/Multiply")
    return _named(ops.multiply(_const(weight), normed), p + "mul/Multiply_1")


def linear(x, weight, scope: str):
    return _named(_ops().matmul(x, weight, False, True), f"__module.{scope}/aten::linear/MatMul")


def _rotate_half(x, half: int):
    ops = _ops()
    first = ops.slice(x, _const([0], np.int64), _const([half], np.int64), _const([1], np.int64), _const([-1], np.int64))
    second = ops.slice(x, _const([half], np.int64), _const([2 * half], np.int64), _const([1], np.int64),
                       _const([-1], np.int64))
    return ops.concat([ops.negative(second), first], -1)


def _rope(x, cos, sin, half: int):
    ops = _ops()
    return ops.add(ops.multiply(x, cos), ops.multiply(_rotate_half(x, half), sin))


def _last_rows(x, count, axis: int):
    """x[..., -count:, ...] along `axis`, with `count` a 1-element i64 tensor."""
    ops = _ops()
    return ops.slice(x, ops.negative(count), _const([np.iinfo(np.int64).max], np.int64), _const([1], np.int64),
                     _const([axis], np.int64))


def _dim(node, axis: int):
    ops = _ops()
    return ops.gather(ops.shape_of(node, "i64"), _const([axis], np.int64), _const(0, np.int64))


def _rope_tables(position_ids, inv_freq: np.ndarray, scaling: float):
    """cos and sin [B, 1, L, head_dim] for every position, as transformers' rotary embedding."""
    ops = _ops()
    freqs = ops.matmul(_const(inv_freq.reshape(1, -1, 1)), ops.unsqueeze(ops.convert(position_ids, "f32"),
                                                                         _const([1], np.int64)), False, False)
    freqs = ops.transpose(freqs, _const([0, 2, 1], np.int64))
    emb = ops.concat([freqs, freqs], -1)
    cos, sin = ops.cos(emb), ops.sin(emb)
    if scaling != 1.0:
        cos, sin = ops.multiply(cos, _const(scaling)), ops.multiply(sin, _const(scaling))
    axis = _const([1], np.int64)
    return ops.unsqueeze(cos, axis), ops.unsqueeze(sin, axis)


def _kv_state(new_context, batch, name: str, kv_heads: int, head_dim: int, beam_idx):
    """past + new context along the sequence axis, kept in a state variable (beam-reordered)."""
    from openvino import opset6

    ops = _ops()
    shape = ops.concat([batch, _const([kv_heads, 0, head_dim], np.int64)], 0)
    init = ops.broadcast(_const(0.0), shape)
    past = opset6.read_value(init, name, np.float32, [-1, kv_heads, -1, head_dim])
    past = ops.gather(past, beam_idx, _const(0, np.int64))
    cached = ops.concat([past, new_context], 2)
    return cached, opset6.assign(cached, name)


def _repeat_kv(x, kv_heads: int, groups: int, head_dim: int):
    ops = _ops()
    if groups == 1:
        return x
    x = ops.reshape(x, _const([0, kv_heads, 1, -1, head_dim], np.int64), True)
    b = _dim(x, 0)
    length = _dim(x, 3)
    x = ops.broadcast(x, ops.concat([b, _const([kv_heads, groups], np.int64), length, _const([head_dim], np.int64)], 0))
    return ops.reshape(x, _const([0, kv_heads * groups, -1, head_dim], np.int64), True)


def _block_mask(q_len, kv_len, window: int | None, causal: bool):
    """0 where a block row may look, float32 min elsewhere: [q_len, kv_len], the queries being the
    last q_len keys. z-lab's rule: a causal layer hides later rows; a window hides keys `window` or
    more positions before the query, and, in a layer attending both ways, as far after it."""
    ops = _ops()
    zero, one = _const(0, np.int64), _const(1, np.int64)
    kv = ops.squeeze(kv_len, _const([0], np.int64))
    q = ops.squeeze(q_len, _const([0], np.int64))
    query_pos = ops.range(ops.subtract(kv, q), kv, one, "i64")
    key_pos = ops.range(zero, kv, one, "i64")
    distance = ops.subtract(ops.unsqueeze(query_pos, _const([1], np.int64)), ops.unsqueeze(key_pos, _const([0], np.int64)))
    hidden = []
    if window:
        hidden.append(ops.greater_equal(distance, _const(window, np.int64)))
        if not causal:
            hidden.append(ops.less_equal(distance, _const(-window, np.int64)))
    if causal:
        hidden.append(ops.less(distance, zero))
    outside = hidden[0]
    for more in hidden[1:]:
        outside = ops.logical_or(outside, more)
    return ops.select(outside, _const(F32_MIN), _const(0.0))


def _shift_rows(x, taps: int):
    """x moved `taps` rows down along dim 1, zeros on top: row i reads row i - taps of the block."""
    ops = _ops()
    padded = ops.pad(x, _const([0, taps, 0], np.int64), _const([0, 0, 0], np.int64), "constant")
    return ops.slice(padded, _const([0], np.int64), _dim(x, 1), _const([1], np.int64), _const([1], np.int64))


class DynamicConv:
    """One `GroupedDynamicCausalConv`: y[i,c] = sum_t (base[side,t,c] + dyn[i,side,t,c // gs]) * x[i-t,c].

    The coefficients of both sides come from one projection of the normed sublayer input, made once
    (`__init__`); `apply(x, side)` is the convolution before (side 0) or after (side 1) the sublayer.
    """

    def __init__(self, config: DraftConfig, normed, base: np.ndarray, projection, scope: str):
        ops = _ops()
        ks, gs = config.conv_kernel_size, config.conv_group_size
        self.groups, self.group_size, self.hidden = config.hidden_size // gs, gs, config.hidden_size
        dyn = linear(normed, projection, scope + ".kernel_projection")  # [B, T, 2*ks*G], group fastest
        dyn = ops.reshape(dyn, _const([0, 0, 2, ks, self.groups, 1], np.int64), True)
        base = _const(np.asarray(base, np.float32).reshape(1, 1, 2, ks, self.groups, gs))
        self.kernel = _named(ops.add(dyn, base), f"__module.{scope}/aten::add/Add")  # [B, T, 2, ks, G, gs]
        self.taps = ks

    def apply(self, x, side: int):
        ops = _ops()
        grouped = _const([0, 0, self.groups, self.group_size], np.int64)
        kernel = ops.gather(self.kernel, _const(side, np.int64), _const(2, np.int64))  # [B, T, ks, G, gs]
        y = None
        for tap in range(self.taps):
            rows = x if tap == 0 else _shift_rows(x, tap)
            term = ops.multiply(ops.gather(kernel, _const(tap, np.int64), _const(2, np.int64)),
                                ops.reshape(rows, grouped, True))
            y = term if y is None else ops.add(y, term)
        return ops.reshape(y, _const([0, 0, self.hidden], np.int64), True)


def build_draft_model(config: DraftConfig, weight: Callable[[str], object], vector: Callable[[str], np.ndarray],
                      progress: Callable[[str], None] | None = None):
    """The stateful DFlash draft `ov.Model`.

    `weight(name)` returns the float32 [out, in] output for a Linear weight (a Constant or a
    decompression subgraph); `vector(name)` the float32 values of a norm weight or a convolution's base. They are called
    once per tensor, in graph order, so a caller can stream and free each source tensor.
    """
    import openvino as ov

    ops = _ops()
    h, heads, kv_heads, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    n_ids, eps = len(config.target_layer_ids), config.rms_norm_eps
    inv_freq, scaling = config.rope()
    windows, causal = config.layer_windows, config.causal_layers

    inputs_embeds = ops.parameter([-1, -1, h], np.float32, name="inputs_embeds")
    hidden_states = ops.parameter([-1, -1, n_ids * h], np.float32, name="hidden_states")
    position_ids = ops.parameter([-1, -1], np.int64, name="position_ids")
    attention_mask = ops.parameter([-1, -1], np.int64, name="attention_mask")
    beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
    params = [inputs_embeds, hidden_states, position_ids, attention_mask, beam_idx]
    for p in params:
        p.output(0).get_tensor().set_names({p.get_friendly_name()})

    batch = _dim(inputs_embeds, 0)
    context = rms_norm(linear(hidden_states, weight("fc.weight"), "fc"), vector("hidden_norm.weight"), eps,
                       "hidden_norm")
    ctx_len = _dim(context, 1)
    cos, sin = _rope_tables(position_ids, inv_freq, scaling)
    # (1 - mask) * min, as optimum turns the 2-D padding mask into an additive one
    additive = ops.multiply(ops.subtract(_const(1.0), ops.convert(attention_mask, "f32")), _const(F32_MIN))
    additive = ops.unsqueeze(additive, _const([1, 2], np.int64))

    x, sinks = inputs_embeds, []
    if config.input_embedding_scale != 1.0:
        x = ops.multiply(x, _const(config.input_embedding_scale))

    def conv(normed, name: str):
        if not config.is_dflash2:
            return None
        return DynamicConv(config, normed, vector(f"{name}.base_kernel"), weight(f"{name}.kernel_projection.weight"), name)

    for i in range(config.num_layers):
        if progress:
            progress(f"layer {i + 1}/{config.num_layers}")
        p, scope = f"layers.{i}.", f"layers.{i}"
        residual = x
        normed = rms_norm(x, vector(p + "input_layernorm.weight"), eps, p + "input_layernorm")
        attention_conv = conv(normed, p + "attention_conv")
        if attention_conv:
            normed = attention_conv.apply(normed, 0)  # queries and the block's keys/values read the conv
        q_len = _dim(normed, 1)
        q = ops.reshape(linear(normed, weight(p + "self_attn.q_proj.weight"), p + "self_attn.q_proj"),
                        _const([0, 0, heads, hd], np.int64), True)
        q = ops.transpose(rms_norm(q, vector(p + "self_attn.q_norm.weight"), eps, p + "self_attn.q_norm"),
                          _const([0, 2, 1, 3], np.int64))
        kv_in = ops.concat([context, normed], 1)
        k = ops.reshape(linear(kv_in, weight(p + "self_attn.k_proj.weight"), p + "self_attn.k_proj"),
                        _const([0, 0, kv_heads, hd], np.int64), True)
        k = ops.transpose(rms_norm(k, vector(p + "self_attn.k_norm.weight"), eps, p + "self_attn.k_norm"),
                          _const([0, 2, 1, 3], np.int64))
        v = ops.reshape(linear(kv_in, weight(p + "self_attn.v_proj.weight"), p + "self_attn.v_proj"),
                        _const([0, 0, kv_heads, hd], np.int64), True)
        v = ops.transpose(v, _const([0, 2, 1, 3], np.int64))

        q = _rope(q, _last_rows(cos, q_len, 2), _last_rows(sin, q_len, 2), hd // 2)
        k = _rope(k, cos, sin, hd // 2)
        split = ops.concat([ctx_len, q_len], 0)
        k_ctx, k_block = ops.variadic_split(k, _const(2, np.int64), split).outputs()
        v_ctx, v_block = ops.variadic_split(v, _const(2, np.int64), split).outputs()
        k_ctx, assign_k = _kv_state(k_ctx, batch, f"past_key_values.{i}.keypresent.{i}.key", kv_heads, hd, beam_idx)
        v_ctx, assign_v = _kv_state(v_ctx, batch, f"past_key_values.{i}.valuepresent.{i}.value", kv_heads, hd, beam_idx)
        sinks += [assign_k, assign_v]
        window = windows[i]
        if window:
            k_ctx, v_ctx = (_last_rows(t, _const([window], np.int64), 2) for t in (k_ctx, v_ctx))
        keys = ops.concat([k_ctx, k_block], 2)
        values = ops.concat([v_ctx, v_block], 2)
        kv_len = _dim(keys, 2)
        mask = _last_rows(additive, kv_len, 3)
        if window or causal[i]:
            mask = ops.add(mask, _block_mask(q_len, kv_len, window, causal[i]))
        keys = _repeat_kv(keys, kv_heads, heads // kv_heads, hd)
        values = _repeat_kv(values, kv_heads, heads // kv_heads, hd)
        attn = ops.scaled_dot_product_attention(q, keys, values, mask, _const(hd ** -0.5), causal=False)
        attn = ops.reshape(ops.transpose(attn, _const([0, 2, 1, 3], np.int64)), _const([0, 0, heads * hd], np.int64), True)
        attn = linear(attn, weight(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj")
        if attention_conv:
            attn = attention_conv.apply(attn, 1)
        x = _named(ops.add(residual, attn), f"__module.{scope}/aten::add/Add")

        residual = x
        normed = rms_norm(x, vector(p + "post_attention_layernorm.weight"), eps, p + "post_attention_layernorm")
        mlp_conv = conv(normed, p + "mlp_conv")
        if mlp_conv:
            normed = mlp_conv.apply(normed, 0)
        gate = _named(ops.swish(linear(normed, weight(p + "mlp.gate_proj.weight"), p + "mlp.gate_proj")),
                      f"__module.{p}mlp.act_fn/aten::silu/Swish")
        up = linear(normed, weight(p + "mlp.up_proj.weight"), p + "mlp.up_proj")
        mlp = linear(ops.multiply(gate, up), weight(p + "mlp.down_proj.weight"), p + "mlp.down_proj")
        if mlp_conv:
            mlp = mlp_conv.apply(mlp, 1)
        x = _named(ops.add(residual, mlp), f"__module.{scope}/aten::add/Add_1")

    out = rms_norm(x, vector("norm.weight"), eps, "norm")
    # drop the seed row: the proposals line up with the candidate tokens GenAI scores
    out = ops.slice(out, _const([1], np.int64), _const([np.iinfo(np.int64).max], np.int64), _const([1], np.int64),
                    _const([1], np.int64))
    result = ops.result(out)
    result.output(0).get_tensor().set_names({"last_hidden_state"})
    return ov.Model([result], sinks, params, "dflash_draft")


def tensor_order(config: DraftConfig, shapes: dict) -> list[str]:
    """The names of the tensors the graph is built from, in the order it asks for them.

    The graph is built once with placeholders instead of weights (a broadcast scalar, which holds
    no memory, and zeros for the small vectors): no weight is read. `shapes` (name -> shape, the
    map's) gives the placeholders; a name the graph asks for that `shapes` lacks is a map that no
    longer fits the graph."""
    ops = _ops()
    asked = []

    def shape(name):
        asked.append(name)
        if name not in shapes or shapes[name] is None or None in shapes[name]:
            raise Gguf2ovError(f"the draft graph needs {name}, which the dflash map does not state with a shape")
        return list(shapes[name])

    build_draft_model(config, lambda name: ops.broadcast(_const(0.0), _const(shape(name), np.int64)).output(0),
                      lambda name: np.zeros(shape(name), np.float32))
    return asked


# --- the draft IR of a variant: built, annotated, saved ---------------------------------------------

def set_dflash_rt_info(ov_model, draft: DraftConfig) -> None:
    # The keys GenAI's draft_model reads (as dflash_mode, dflash_mask_token_id,
    # dflash_target_layer_ids), with the values optimum writes for the same draft.
    ov_model.set_rt_info("True", ["dflash_mode"])
    ov_model.set_rt_info(str(draft.mask_token_id), ["dflash", "mask_token_id"])
    ov_model.set_rt_info(",".join(map(str, draft.target_layer_ids)), ["dflash", "target_layer_ids"])


def build_draft_ir(draft, variant, progress: bool = True, observe=None):
    """The draft `ov.Model` of `variant` (not yet saved) from `draft`, a model.source.DraftSource.
    Returns (model, weight forms)."""
    from .weights import WeightForms

    forms = WeightForms(draft, variant, observe=observe)
    model = build_draft_model(draft.config, forms.weight, forms.vector,
                              progress=(lambda m: step(f"{variant.name}: {m}", progress)) if progress else None)
    set_dflash_rt_info(model, draft.config)
    model.set_rt_info(variant.name, list(VARIANT_RT_INFO))  # verify holds a gguf transcode to float32's tolerance
    if variant.format.annotate is not None:
        variant.format.annotate(model, variant)
    return model, forms


def save_draft_ir(ov_model, out_dir, forms=None) -> None:
    """Save the IR; postponed weights are made one at a time while the .bin is written.

    A weight that fails to load while OpenVINO writes (a corrupt tensor, Ctrl-C) stops the save
    with its own error, not OpenVINO's rewording of it.
    """
    import openvino as ov

    xml = Path(out_dir) / IR_XML
    try:
        ov.save_model(ov_model, str(xml), compress_to_fp16=False)
    except BaseException:
        if forms is not None and forms.failure is not None:
            raise forms.failure from None
        raise
    if forms is not None and forms.variant.format.after_save is not None:
        forms.variant.format.after_save(xml)


def describe_ir(ov_model) -> dict:
    def port(p):
        return [p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()]

    rt = {}
    for key in (("dflash_mode",), ("dflash", "mask_token_id"), ("dflash", "target_layer_ids")):
        if ov_model.has_rt_info(list(key)):
            rt["/".join(key)] = ov_model.get_rt_info(list(key)).astype(str)
    return {
        "inputs": [port(p) for p in ov_model.inputs],
        "outputs": [port(p) for p in ov_model.outputs],
        "state_variables": len(ov_model.get_variables()),
        "rt_info": rt,
    }


def write_draft_ir(draft, folder, variant: Variant, progress: bool = True, observe=None, options: dict | None = None):
    """Build the IR of `variant` from `draft` (a model.source.DraftSource) and save it in `folder`
    with the draft's config.json and the provenance (`options` added to what the draft and variant
    record). Returns (describe_ir of the model, the WeightForms that made its weights)."""
    step(f"building the {variant.name} draft from {draft.describe()}", progress)
    ov_model, forms = build_draft_ir(draft, variant, progress, observe)
    step(f"saving the {variant.name} IR", progress)
    save_draft_ir(ov_model, folder, forms)
    info = describe_ir(ov_model)
    del ov_model
    # GenAI needs only the .xml/.bin; config.json lets `verify` and the tap scan read rt_info and geometry.
    atomic_write_text(Path(folder) / CONFIG_FILE, json.dumps(draft.config.raw, indent=2) + "\n")
    record = {"weight_format": variant.weight_format, "variant": variant.name, **draft.record(),
              "transcoded": len(forms.transcoded), "nncf_backup": sorted(n for n, s in forms.plan.items() if s.backup),
              **(options or {})}
    atomic_write_text(Path(folder) / PROVENANCE_FILE, json.dumps(provenance({"source": draft}, record), indent=2) + "\n")
    return info, forms
