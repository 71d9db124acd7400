"""The stateful decoder-only LM graph of a DFlash target, built with OpenVINO's opset weight by weight.

optimum-intel exports a target by tracing the whole model in PyTorch (an 8B model: 6-9 GB of RAM
from its bf16 checkpoint). This module writes the same graph from the config alone and asks a
`weight(name)` callable for each weight as it goes (as draft/graph.py does for drafts), so each
weight arrives in its variant's form (float32, float16, NNCF codes, the GGUF's own grid) and is
made only while the IR is written.

The graph is what optimum-intel 2.2.0 writes for `text-generation-with-past` (the reference in
tests/targets/test_target_graph.py: interface, state variables, rt_info, and logits and hidden states over
two stateful steps):
- inputs `input_ids`, `attention_mask`, `position_ids`, `beam_idx`; output `logits`; the state
  variables each layer's kinds keep, reordered by `beam_idx` and named as optimum names them: an
  attention layer's K and V (`past_key_values.N.keypresent.N.key`, ...); in a hybrid, a Gated
  DeltaNet layer's conv and recurrent states and a gated attention layer's K and V, numbered among
  the layers of their kind (`cache_params.past.conv.Jcache_params.present.conv.J`, `.ssm.`, `.key.`,
  `.value.`); an MLP, dense or a mixture of experts, keeps none;
- transformers 5.5.4's forward for each architecture a map's `target:` section describes, layer
  kind by layer kind (`layers/`) between the norms and residual adds the map's layer steps place
  (`decoder.py`);
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
from ..ir.graph_ops import const, dim, linear, named, rms_norm, rope_tables
from ..ir.graph_ops import ops as _ops
from ..ir.variants import VARIANT_RT_INFO
from .config import TargetConfig
from .decoder import EMBEDDING, FINAL_NORM, LM_HEAD, layer_kinds, layer_steps
from .layers import layer_prefix

# optimum's mask fills hidden positions with float16's lowest value, not float32's (patching_utils.py
# eager_mask_without_vmap): exp() of either is 0 in float32
MASKED = float(np.finfo(np.float16).min)


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


class _Graph:
    """The target graph under construction, as the layer kinds see it: the inputs, each weight asked
    for by name, the norms, the attention masks and RoPE tables (made once, when first asked for), the
    state variables' Assigns, and `shared`: what a kind leaves for later layers or kinds (a donor
    layer's keys and values for layers that share them, inputs made once for every layer)."""

    def __init__(self, config: TargetConfig, weight, vector, input_order=None, inputs_embeds: bool = False):
        ops = _ops()
        self.config, self.weight, self._vector = config, weight, vector
        self._input_order = input_order
        self.attention_mask = ops.parameter([-1, -1], np.int64, name="attention_mask")
        self.position_ids = ops.parameter([-1, -1], np.int64, name="position_ids")
        self.beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
        if inputs_embeds:  # a VLM's language model, as optimum's image-text-to-text export has it
            self.input_ids = None
            self.inputs_embeds = ops.parameter([-1, -1, config.hidden_size], np.float32, name="inputs_embeds")
            # Gemma's per-layer inputs (none here: hidden_size_per_layer_input 0), which GenAI feeds
            per_layer = ops.parameter([-1, -1, -1, 0], np.float32, name="per_layer_inputs")
            self.params = [self.attention_mask, self.position_ids, self.inputs_embeds, per_layer, self.beam_idx]
            first = self.inputs_embeds
        else:
            self.input_ids = ops.parameter([-1, -1], np.int64, name="input_ids")
            self.params = [self.input_ids, self.attention_mask, self.position_ids, self.beam_idx]
            first = self.input_ids
        for p in self.params:
            p.output(0).get_tensor().set_names({p.get_friendly_name()})
        self.batch, self.q_len = dim(first, 0), dim(first, 1)
        self.sinks, self.shared = [], {}
        self.embeddings = None  # the token embeddings the layers start from (set once the embedding is built)
        self._masks, self._rope = None, {}

    def vector(self, name: str) -> np.ndarray:
        return self._vector(name)

    def ordered_input(self, x, name: str):
        """`x` in the order the weight made for `name` (asked for already) takes its inputs in: a
        Gather over the last axis where that weight keeps a file's column order, else `x`."""
        order = self._input_order(name) if self._input_order is not None else None
        if order is None:
            return x
        return _ops().gather(x, const(order, np.int64), const(-1, np.int64))

    def bias(self, name: str, present: bool):
        return self._vector(name) if present else None

    def norm(self, x, name: str, scope: str):
        """An RMSNorm of the model's form: Gemma's and Qwen3.5's scale by (1 + w)."""
        c, w = self.config, self._vector(name)
        offset = c.options["norm_offset"]
        return rms_norm(x, w + np.float32(offset) if offset else w, c.rms_norm_eps, scope)

    def mask(self, window: int | None, past_len):
        """The additive mask of a layer (full, or sliding over `window`); `past_len`: the node whose
        dimension 2 is the cached length, used by the first layer that asks."""
        if self._masks is None:
            self._masks = _Masks(self.attention_mask, dim(past_len, 2), self.q_len, self.batch)
        return self._masks.for_window(window)

    def rope(self, layer_type: str):
        """cos and sin of a layer type's RoPE, from `position_ids`."""
        if layer_type not in self._rope:
            self._rope[layer_type] = rope_tables(self.position_ids, *self.config.rope[layer_type])
        return self._rope[layer_type]


def build_target_model(config: TargetConfig, weight: Callable[[str], object], vector: Callable[[str], np.ndarray],
                       progress: Callable[[str], None] | None = None, input_order=None, inputs_embeds: bool = False):
    """(the stateful target `ov.Model`, its hidden-state locators {layer: {producer, output_index}}).

    `weight(name)` returns the float32 output for a Linear weight or the embedding table (a
    Constant or a decompression subgraph); `vector(name)` the float32 values of a norm weight or a
    bias. Each is called once per tensor, in graph order (`decoder.tensor_shapes`), so a caller can stream
    and free each source tensor. `input_order(name)`: the order a weight takes its inputs in, when
    not theirs (WeightForms.input_order). Each layer is its mixer kind and its MLP kind (`layers/`)
    between the decoder's norms and residual adds. `inputs_embeds`: the graph takes the embeddings (scaled
    already, by `build_text_embeddings_model`) in place of token ids, as a VLM's language model does.
    """
    import openvino as ov

    c = config
    g = _Graph(c, weight, vector, input_order, inputs_embeds)
    if inputs_embeds:
        table = weight(EMBEDDING) if c.tie_word_embeddings else None  # the head's, when tied
        x = g.inputs_embeds
    else:
        table, x = _embedded(g.input_ids, weight, c)
    g.embeddings = x  # the scaled token embeddings, which Gemma 4's per-layer inputs read (layers/per_layer_input.py)

    locators = {}
    for i in range(c.num_layers):
        if progress:
            progress(f"layer {i + 1}/{c.num_layers}")
        x = _decoder_layer(g, x, i)
        if i < c.num_layers - 1:
            locators[i] = x

    x = g.norm(x, FINAL_NORM + ".weight", FINAL_NORM)
    locators[c.num_layers - 1] = x
    ops = _ops()
    logits = linear(x, table if c.tie_word_embeddings else weight(LM_HEAD), "lm_head")
    if c.final_logit_softcapping is not None:
        cap = const(c.final_logit_softcapping)
        logits = named(ops.tanh(named(ops.divide(logits, cap), "aten::div/Divide")), "aten::tanh/Tanh")
        logits = named(ops.multiply(logits, cap), "aten::mul/Multiply")
    result = ops.result(logits)
    result.output(0).get_tensor().set_names({"logits"})
    model = ov.Model([result], g.sinks, g.params, "target")
    return model, {i: {"producer": node.get_friendly_name(), "output_index": 0} for i, node in locators.items()}


def _embedded(input_ids, weight, c: TargetConfig):
    """(the embedding table, the scaled embeddings of `input_ids`)."""
    ops = _ops()
    table = weight(EMBEDDING)
    if "embed_tokens" not in table.get_node().get_friendly_name():
        # GenAI finds the embedding by its table's size or, below 1000 rows, by this name
        table.get_node().set_friendly_name(f"self.{EMBEDDING}/decompressed")
    scope = "__module.model.embed_tokens/aten::"
    ids = named(ops.convert(input_ids, "i32"), scope + "embedding/Convert")
    x = named(ops.gather(table, ids, const(0, np.int64)), scope + "embedding/Gather")
    if c.embedding_scale is not None:
        x = named(ops.multiply(x, const(c.embedding_scale)), scope + "mul/Multiply")
    return table, x


def build_text_embeddings_model(config: TargetConfig, weight: Callable[[str], object]):
    """A VLM's openvino_text_embeddings_model, as optimum exports it: token ids (`input`) to the language
    model's `inputs_embeds`, Gemma's scale included."""
    import openvino as ov

    ops = _ops()
    input_ids = ops.parameter([-1, -1], np.int64, name="input")
    input_ids.output(0).get_tensor().set_names({"input"})
    _, x = _embedded(input_ids, weight, config)
    result = ops.result(x)
    result.output(0).get_tensor().set_names({"inputs_embeds"})
    return ov.Model([result], [input_ids], "text_embeddings")


def build_per_layer_embeddings_model(config: TargetConfig):
    """A Gemma VLM's openvino_text_embeddings_per_layer_model without per-layer embeddings
    (hidden_size_per_layer_input 0), as optimum exports it: zeros [B, L, layers, 0] for GenAI to feed the
    language model's `per_layer_inputs`."""
    import openvino as ov

    ops = _ops()
    input_ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    input_ids.output(0).get_tensor().set_names({"input_ids"})
    shape = ops.concat([ops.shape_of(input_ids, "i64"), const([config.num_layers, 0], np.int64)], 0)
    result = ops.result(ops.broadcast(const(0.0), shape))
    result.output(0).get_tensor().set_names({"text_embeds_per_layer"})
    return ov.Model([result], [input_ids], "text_embeddings_per_layer")


def _decoder_layer(g, x, i: int):
    """Layer `i`: the map's residual steps (`decoder.py`), each x + post_norm(kind(norm(x)))."""
    ops, p = _ops(), layer_prefix(i)  # tensor names and node scopes alike
    for k, (step, kind) in enumerate(layer_steps(g.config, i)):
        y = kind.build(g, g.norm(x, p + step.norm + ".weight", p + step.norm) if step.norm else x, i)
        if step.post_norm:
            y = g.norm(y, p + step.post_norm + ".weight", p + step.post_norm)
        x = named(ops.add(x, y), f"__module.{p[:-1]}/aten::add/Add" + (f"_{k}" if k else "")) if step.residual else y
    return x


# The .xml bytes of a target's nodes outside its layers (inputs, embedding, masks, RoPE, final norm, head);
# measured on 4- and 8-layer qwen3 targets.
XML_BASE_BYTES = 30_000


def target_ir_bytes(forms) -> int:
    """The bytes the target's IR will take on disk (.bin and .xml), within a few percent (measured):
    its weights' forms and the nodes of its layers' kinds."""
    c = forms.source.config
    nodes = XML_BASE_BYTES + sum(kind.IR_XML_BYTES for _, kind in layer_kinds(c))
    return forms.stored_bytes() + nodes


# --- the target IR of a variant: built, annotated -------------------------------------------------

def set_target_rt_info(model, locators: dict, variant, kept=()) -> None:
    """The rt_info optimum writes for `text-generation-with-past`, and which GenAI reads: the
    hidden-state locators, and `runtime_options` (activations scaled by 8 on fp16 devices; an f16
    KV cache unless the weights are compressed, as optimum decides with `quantized_model`).
    `kept`: weights kept in float32 (a router), whose MatMuls an NNCF variant records as its
    ignored scope, as the whole-model run records them."""
    layers = {str(i): loc for i, loc in sorted(locators.items())}
    model.set_rt_info(json.dumps({"layers": layers}, separators=(",", ":")), LOCATORS_KEY)
    model.set_rt_info("8.0", ["runtime_options", "ACTIVATIONS_SCALE_FACTOR"])
    if variant.format.compressed is False:
        model.set_rt_info("f16", ["runtime_options", "KV_CACHE_PRECISION"])
    model.set_rt_info(variant.name, list(VARIANT_RT_INFO))
    if variant.format.annotate is not None:
        if ignored := _consumers(model, kept):
            variant.format.annotate(model, variant, ignored)
        else:
            variant.format.annotate(model, variant)


def _consumers(model, weights) -> list[str]:
    """The MatMuls (friendly names, in graph order) whose weight is one of `weights` (named `self.<name>`)."""
    constants = {f"self.{name}" for name in weights}
    return [op.get_friendly_name() for op in model.get_ordered_ops() if op.get_type_name() == "MatMul"
            and op.input_value(1).get_node().get_friendly_name() in constants] if constants else []


def target_forms(source, variant, grid: str = "folded", allow_nonfinite: bool = False):
    """The WeightForms of a target: streamed while the IR is written, `gguf` weights in the `grid` form
    (ir.weights.GRIDS; by default folded, the form the CPU plugin runs without private copies and whose
    greedy text a draft keeps, gguf/transcode.py), the lm_head whole (GenAI grafts its MatMul's weight onto a draft); NaN and Inf
    weights refused unless `allow_nonfinite`."""
    from ..ir.weights import WeightForms

    return WeightForms(source, variant, streamed=True, grid=grid, whole=(LM_HEAD,), allow_nonfinite=allow_nonfinite)


def build_target_ir(forms, progress: Callable[[str], None] | None = None, inputs_embeds: bool = False):
    """The target `ov.Model` that `forms` (`target_forms`: its source, variant and every weight's form, the NNCF
    plan checked) describe, not yet saved: its weights are made while it is saved (`save_ir(model, folder,
    forms)`). `inputs_embeds`: a VLM's language model (`build_target_model`)."""
    source = forms.source
    model, locators = build_target_model(source.config, forms.weight, forms.vector, progress=progress,
                                         input_order=forms.input_order, inputs_embeds=inputs_embeds)
    set_target_rt_info(model, locators, forms.variant, getattr(source, "kept", ()))
    return model
