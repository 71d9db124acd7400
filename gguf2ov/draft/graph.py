"""The DFlash draft graph built directly with OpenVINO's opset, one weight at a time.

Tracing optimum-intel's `Qwen3DFlashForCausalLM` needs the whole draft as a float32 PyTorch model,
and the traced IR holds it again: 13-17 GB for a 1 B draft. This module writes the same graph from
the config alone and asks a `weight(name)` callable for each Linear weight as it goes, so a weight
can arrive already in the form its variant stores (float32, float16, NNCF codes, the GGUF's own
codes) and nothing else of the draft is in memory.

The graph reproduces optimum-intel 2.2.0's export of that class, which stays the reference
(tests/draft/test_draft_graph.py compares interface, rt_info and outputs):
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
(z-lab's `GroupedDynamicCausalConv`, gguf2ov/tools/dflash2_torch.py): before and after attention, before
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
from ..names import CONFIG_FILE, PROVENANCE_FILE
from ..outputs import atomic_write_text
from ..progress import step
from ..provenance import provenance
from .config import DraftConfig
from .embedding import RT_INFO as EMBEDDING_RT_INFO
from .embedding import record_form
from .head import draft_grid
from ..ir.graph_ops import (F32_MIN, I64_MAX, apply_rope, const, dim, kv_state, last_rows, linear, named, repeat_kv,
                        rms_norm, rope_tables)
from ..ir.graph_ops import ops as _ops
from ..ir.variants import VARIANT_RT_INFO, Variant
from ..ir.weights import save_ir


def _block_mask(q_len, kv_len, window: int | None, causal: bool):
    """0 where a block row may look, float32 min elsewhere: [q_len, kv_len], the queries being the
    last q_len keys. z-lab's rule: a causal layer hides later rows; a window hides keys `window` or
    more positions before the query, and, in a layer attending both ways, as far after it."""
    ops = _ops()
    zero, one = const(0, np.int64), const(1, np.int64)
    kv = ops.squeeze(kv_len, const([0], np.int64))
    q = ops.squeeze(q_len, const([0], np.int64))
    query_pos = ops.range(ops.subtract(kv, q), kv, one, "i64")
    key_pos = ops.range(zero, kv, one, "i64")
    distance = ops.subtract(ops.unsqueeze(query_pos, const([1], np.int64)), ops.unsqueeze(key_pos, const([0], np.int64)))
    hidden = []
    if window:
        hidden.append(ops.greater_equal(distance, const(window, np.int64)))
        if not causal:
            hidden.append(ops.less_equal(distance, const(-window, np.int64)))
    if causal:
        hidden.append(ops.less(distance, zero))
    outside = hidden[0]
    for more in hidden[1:]:
        outside = ops.logical_or(outside, more)
    return ops.select(outside, const(F32_MIN), const(0.0))


def _shift_rows(x, taps: int):
    """x moved `taps` rows down along dim 1, zeros on top: row i reads row i - taps of the block."""
    ops = _ops()
    padded = ops.pad(x, const([0, taps, 0], np.int64), const([0, 0, 0], np.int64), "constant")
    return ops.slice(padded, const([0], np.int64), dim(x, 1), const([1], np.int64), const([1], np.int64))


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
        dyn = ops.reshape(dyn, const([0, 0, 2, ks, self.groups, 1], np.int64), True)
        base = const(np.asarray(base, np.float32).reshape(1, 1, 2, ks, self.groups, gs))
        self.kernel = named(ops.add(dyn, base), f"__module.{scope}/aten::add/Add")  # [B, T, 2, ks, G, gs]
        self.taps = ks

    def apply(self, x, side: int):
        ops = _ops()
        grouped = const([0, 0, self.groups, self.group_size], np.int64)
        kernel = ops.gather(self.kernel, const(side, np.int64), const(2, np.int64))  # [B, T, ks, G, gs]
        y = None
        for tap in range(self.taps):
            rows = x if tap == 0 else _shift_rows(x, tap)
            term = ops.multiply(ops.gather(kernel, const(tap, np.int64), const(2, np.int64)),
                                ops.reshape(rows, grouped, True))
            y = term if y is None else ops.add(y, term)
        return ops.reshape(y, const([0, 0, self.hidden], np.int64), True)


def build_draft_model(config: DraftConfig, weight: Callable[[str], object], vector: Callable[[str], np.ndarray],
                      progress: Callable[[str], None] | None = None):
    """The stateful DFlash draft `ov.Model`.

    `weight(name)` returns the float32 [out, in] output for a Linear weight (a Constant or a
    decompression subgraph); `vector(name)` the float32 values of a norm weight or a convolution's base. They are called
    once per tensor, in graph order, so a caller can stream and free each source tensor.
    """
    import openvino as ov

    ops = _ops()
    params = _draft_parameters(config)
    inputs_embeds = params[0]
    layers = _DraftLayers(config, weight, vector, *params)
    x, sinks = inputs_embeds, []
    if config.input_embedding_scale != 1.0:
        x = ops.multiply(x, const(config.input_embedding_scale))
    for i in range(config.num_layers):
        if progress:
            progress(f"layer {i + 1}/{config.num_layers}")
        x, assigns = layers.attention(i, x)
        sinks += assigns
        x = layers.mlp(i, x)

    out = rms_norm(x, vector("norm.weight"), config.rms_norm_eps, "norm")
    # drop the seed row: the proposals line up with the candidate tokens GenAI scores
    out = ops.slice(out, const([1], np.int64), const([I64_MAX], np.int64), const([1], np.int64),
                    const([1], np.int64))
    result = ops.result(out)
    result.output(0).get_tensor().set_names({"last_hidden_state"})
    return ov.Model([result], sinks, params, "dflash_draft")


def _draft_parameters(config: DraftConfig) -> list:
    """The draft's inputs, named as optimum names them: inputs_embeds, hidden_states, position_ids,
    attention_mask, beam_idx."""
    ops = _ops()
    h, n_ids = config.hidden_size, len(config.target_layer_ids)
    params = [ops.parameter([-1, -1, h], np.float32, name="inputs_embeds"),
              ops.parameter([-1, -1, n_ids * h], np.float32, name="hidden_states"),
              ops.parameter([-1, -1], np.int64, name="position_ids"),
              ops.parameter([-1, -1], np.int64, name="attention_mask"),
              ops.parameter([-1], np.int32, name="beam_idx")]
    for p in params:
        p.output(0).get_tensor().set_names({p.get_friendly_name()})
    return params


class _DraftLayers:
    """What every decoder layer of the draft reads beside its own weights: the context features
    `hidden_norm(fc(hidden_states))` (made here, the graph's first weights), the RoPE tables over all
    positions, the additive padding mask, and the batch and beam order of its K/V state. `attention`
    and `mlp` add a layer's two halves, asking `weight`/`vector` for its tensors in graph order."""

    def __init__(self, config: DraftConfig, weight, vector, inputs_embeds, hidden_states, position_ids,
                 attention_mask, beam_idx):
        ops = _ops()
        self.config, self.weight, self.vector, self.beam_idx = config, weight, vector, beam_idx
        self.eps = config.rms_norm_eps
        self.batch = dim(inputs_embeds, 0)
        self.context = rms_norm(linear(hidden_states, weight("fc.weight"), "fc"), vector("hidden_norm.weight"),
                                self.eps, "hidden_norm")
        self.ctx_len = dim(self.context, 1)
        inv_freq, scaling = config.rope()
        self.cos, self.sin = rope_tables(position_ids, inv_freq, scaling)
        # (1 - mask) * min, as optimum turns the 2-D padding mask into an additive one
        additive = ops.multiply(ops.subtract(const(1.0), ops.convert(attention_mask, "f32")), const(F32_MIN))
        self.additive = ops.unsqueeze(additive, const([1, 2], np.int64))

    def _conv(self, normed, name: str):
        """DFlash 2's dynamic convolution of `name` (None for a v1 draft)."""
        if not self.config.is_dflash2:
            return None
        return DynamicConv(self.config, normed, self.vector(f"{name}.base_kernel"),
                           self.weight(f"{name}.kernel_projection.weight"), name)

    def _projection(self, x, p: str, proj: str, heads: int):
        """`proj`'s Linear of layer prefix `p` as [B, heads, T, head_dim], its q/k norm applied when it has one."""
        ops, hd = _ops(), self.config.head_dim
        y = ops.reshape(linear(x, self.weight(f"{p}self_attn.{proj}.weight"), f"{p}self_attn.{proj}"),
                        const([0, 0, heads, hd], np.int64), True)
        if proj != "v_proj":
            norm = f"{p}self_attn.{proj[0]}_norm"
            y = rms_norm(y, self.vector(f"{norm}.weight"), self.eps, norm)
        return ops.transpose(y, const([0, 2, 1, 3], np.int64))

    def attention(self, i: int, x):
        """Layer `i`'s attention half, residual added: queries from the block rows, keys and values from
        [context, block], the context's K/V kept in the layer's state. Returns (x, the state's Assigns)."""
        ops, c = _ops(), self.config
        heads, kv_heads, hd = c.num_heads, c.num_kv_heads, c.head_dim
        p, window, causal = f"layers.{i}.", c.layer_windows[i], c.causal_layers[i]
        residual = x
        normed = rms_norm(x, self.vector(p + "input_layernorm.weight"), self.eps, p + "input_layernorm")
        conv = self._conv(normed, p + "attention_conv")
        if conv:
            normed = conv.apply(normed, 0)  # queries and the block's keys/values read the conv
        q_len = dim(normed, 1)
        q = self._projection(normed, p, "q_proj", heads)
        kv_in = ops.concat([self.context, normed], 1)
        k = self._projection(kv_in, p, "k_proj", kv_heads)
        v = self._projection(kv_in, p, "v_proj", kv_heads)

        q = apply_rope(q, last_rows(self.cos, q_len, 2), last_rows(self.sin, q_len, 2), hd // 2)
        k = apply_rope(k, self.cos, self.sin, hd // 2)
        split = ops.concat([self.ctx_len, q_len], 0)
        k_ctx, k_block = ops.variadic_split(k, const(2, np.int64), split).outputs()
        v_ctx, v_block = ops.variadic_split(v, const(2, np.int64), split).outputs()
        k_ctx, assign_k = kv_state(k_ctx, self.batch, f"past_key_values.{i}.keypresent.{i}.key", kv_heads, hd,
                                   self.beam_idx)
        v_ctx, assign_v = kv_state(v_ctx, self.batch, f"past_key_values.{i}.valuepresent.{i}.value", kv_heads, hd,
                                   self.beam_idx)
        if window:
            k_ctx, v_ctx = (last_rows(t, const([window], np.int64), 2) for t in (k_ctx, v_ctx))
        keys = ops.concat([k_ctx, k_block], 2)
        values = ops.concat([v_ctx, v_block], 2)
        kv_len = dim(keys, 2)
        mask = last_rows(self.additive, kv_len, 3)
        if window or causal:
            mask = ops.add(mask, _block_mask(q_len, kv_len, window, causal))
        keys = repeat_kv(keys, kv_heads, heads // kv_heads, hd)
        values = repeat_kv(values, kv_heads, heads // kv_heads, hd)
        attn = ops.scaled_dot_product_attention(q, keys, values, mask, const(hd ** -0.5), causal=False)
        attn = ops.reshape(ops.transpose(attn, const([0, 2, 1, 3], np.int64)), const([0, 0, heads * hd], np.int64), True)
        attn = linear(attn, self.weight(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj")
        if conv:
            attn = conv.apply(attn, 1)
        return named(ops.add(residual, attn), f"__module.layers.{i}/aten::add/Add"), [assign_k, assign_v]

    def mlp(self, i: int, x):
        """Layer `i`'s MLP half (SwiGLU), residual added."""
        ops, p = _ops(), f"layers.{i}."
        residual = x
        normed = rms_norm(x, self.vector(p + "post_attention_layernorm.weight"), self.eps,
                          p + "post_attention_layernorm")
        conv = self._conv(normed, p + "mlp_conv")
        if conv:
            normed = conv.apply(normed, 0)
        gate = named(ops.swish(linear(normed, self.weight(p + "mlp.gate_proj.weight"), p + "mlp.gate_proj")),
                     f"__module.{p}mlp.act_fn/aten::silu/Swish")
        up = linear(normed, self.weight(p + "mlp.up_proj.weight"), p + "mlp.up_proj")
        mlp = linear(ops.multiply(gate, up), self.weight(p + "mlp.down_proj.weight"), p + "mlp.down_proj")
        if conv:
            mlp = conv.apply(mlp, 1)
        return named(ops.add(residual, mlp), f"__module.layers.{i}/aten::add/Add_1")


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

    build_draft_model(config, lambda name: ops.broadcast(const(0.0), const(shape(name), np.int64)).output(0),
                      lambda name: np.zeros(shape(name), np.float32))
    return asked


# --- the draft IR of a variant: built, annotated, saved ---------------------------------------------

def set_dflash_rt_info(ov_model, draft: DraftConfig) -> None:
    # The keys GenAI's draft_model reads (as dflash_mode, dflash_mask_token_id,
    # dflash_target_layer_ids), with the values optimum writes for the same draft.
    ov_model.set_rt_info("True", ["dflash_mode"])
    ov_model.set_rt_info(str(draft.mask_token_id), ["dflash", "mask_token_id"])
    ov_model.set_rt_info(",".join(map(str, draft.target_layer_ids)), ["dflash", "target_layer_ids"])


def build_draft_ir(draft, variant, progress: bool = True, observe=None, grid: str = "compact"):
    """The draft `ov.Model` of `variant` (not yet saved) from `draft`, a draft.source.DraftSource;
    `grid` (ir.weights.GRIDS): "folded" gives a `gguf` variant's grid the form the CPU plugin runs
    without private copies (gguf/transcode.py). Returns (model, weight forms)."""
    from ..ir.weights import WeightForms

    forms = WeightForms(draft, variant, observe=observe, grid=grid)
    model = build_draft_model(draft.config, forms.weight, forms.vector,
                              progress=(lambda m: step(f"{variant.name}: {m}", progress)) if progress else None)
    set_dflash_rt_info(model, draft.config)
    record_form(model, draft.config)  # which embeddings it multiplies, and by what (draft/embedding.py)
    model.set_rt_info(variant.name, list(VARIANT_RT_INFO))  # verify holds a gguf transcode to float32's tolerance
    if variant.format.annotate is not None:
        variant.format.annotate(model, variant)
    return model, forms


def describe_ir(ov_model) -> dict:
    def port(p):
        return [p.get_any_name(), str(p.get_partial_shape()), p.get_element_type().get_type_name()]

    rt = {}
    for key in (("dflash_mode",), ("dflash", "mask_token_id"), ("dflash", "target_layer_ids"), *EMBEDDING_RT_INFO):
        if ov_model.has_rt_info(list(key)):
            rt["/".join(key)] = ov_model.get_rt_info(list(key)).astype(str)
    return {
        "inputs": [port(p) for p in ov_model.inputs],
        "outputs": [port(p) for p in ov_model.outputs],
        "state_variables": len(ov_model.get_variables()),
        "rt_info": rt,
    }


# The .xml bytes of a draft's nodes, its weights' decompression aside (measured on 2- and 5-layer
# drafts, openvino 2026.4.1): 25 KB, 79 KB a layer, 55 KB more a layer for DFlash 2's convolutions.
XML_BASE_BYTES, XML_LAYER_BYTES, XML_DFLASH2_LAYER_BYTES = 25_400, 79_200, 55_300
# config.json and gguf2ov.json beside the IR
SMALL_FILES_BYTES = 8_000


def draft_ir_bytes(draft, variant: Variant, head=None) -> int:
    """The bytes a draft folder of `variant` takes on disk, within a few percent (measured); `head` (a
    draft.head.HeadChoice) adds what its own embedding and lm_head take."""
    from ..ir.weights import WeightForms

    c = draft.config
    layer = XML_LAYER_BYTES + (XML_DFLASH2_LAYER_BYTES if c.is_dflash2 else 0)
    own = head.added_bytes if head is not None else 0
    weights = WeightForms(draft, variant, grid=draft_grid(head.own if head is not None else None)).stored_bytes()
    return weights + XML_BASE_BYTES + layer * c.num_layers + SMALL_FILES_BYTES + own


def write_draft_ir(draft, folder, variant: Variant, progress: bool = True, observe=None, options: dict | None = None,
                   head=None):
    """Build the IR of `variant` from `draft` (a draft.source.DraftSource) and save it in `folder`
    with the draft's config.json and the provenance (`options` added to what the draft and variant
    record); `head` (a draft.head.OwnHead) gives it the target's embedding and lm_head of its own, and
    its grid the form `draft_grid` says.
    Returns (describe_ir of the model, the WeightForms that made its weights)."""
    step(f"building the {variant.name} draft from {draft.describe()}", progress)
    ov_model, forms = build_draft_ir(draft, variant, progress, observe, grid=draft_grid(head))
    if head is not None:
        step(f"{variant.name}: the target's embedding and lm_head as the draft's own ({head.form.name})", progress)
        head.attach(ov_model, forms.postponing("lm_head"))
        options = {**(options or {}), **head.record()}
    step(f"saving the {variant.name} IR", progress)
    save_ir(ov_model, folder, forms)
    info = describe_ir(ov_model)
    del ov_model
    # GenAI needs only the .xml/.bin; config.json lets `verify` and the tap scan read rt_info and geometry.
    atomic_write_text(Path(folder) / CONFIG_FILE, json.dumps(draft.config.raw, indent=2) + "\n")
    record = {"weight_format": variant.weight_format, "variant": variant.name, **draft.record(),
              "transcoded": len(forms.transcoded), "nncf_backup": sorted(n for n, s in forms.plan.items() if s.backup),
              **(options or {})}
    atomic_write_text(Path(folder) / PROVENANCE_FILE, json.dumps(provenance({"source": draft}, record), indent=2) + "\n")
    return info, forms
