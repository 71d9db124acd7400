"""Gemma 4's per-layer embeddings (E2B, E4B: `hidden_size_per_layer_input` P > 0), as transformers 5.5.4's
Gemma4TextModel and llama.cpp 0c1e570's src/models/gemma4.cpp compute them.

Once for the model, from the token ids and the scaled token embeddings e (`g.embeddings`), the inputs
of every layer [B, L, layers, P]:
    (norm(reshape(e @ per_layer_model_projection^T * hidden_size^-0.5)) + table[ids] * sqrt(P)) * 2^-0.5
where table is embed_tokens_per_layer [vocab_size_per_layer_input, layers * P] (read by a Gather, as the
token embedding is) and norm per_layer_projection_norm over each layer's P values. In each layer, after
its MLP's residual add, the step a map places with this kind adds
    post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(x)) * inputs[:, :, i]))
to the stream (the post-norm is the map step's). The model-level tensors are read by the first layer.
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import const, linear, named
from ...ir.graph_ops import ops as _ops
from ...maps.rules import is_int
from .kind import LayerKind
from .pieces import activation, layer_prefix

_TABLE = "model.embed_tokens_per_layer.weight"
_PROJECTION = "model.per_layer_model_projection.weight"
_PROJECTION_NORM = "model.per_layer_projection_norm"
_INPUTS = "per_layer_inputs"  # g.shared key of the inputs every layer reads


def _width(c) -> int:
    return c.hf.hidden_size_per_layer_input


class PerLayerInput(LayerKind, name="per_layer_input", role="block"):
    # the layer's gate, projection and post-norm, the model's inputs shared among the layers (measured on the fp32
    # per-layer-embeddings target of tests/targets/test_gemma4_target.py: 12.2 KB a layer over 6 layers)
    IR_XML_BYTES = 12_000

    def check(self, c, where):
        for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input"):
            value = getattr(c.hf, key, None)
            if not (is_int(value) and value > 0):
                raise Gguf2ovError(f"{where}: {key} is {value!r}, not a positive integer (per-layer embeddings)")

    def tensors(self, c, i):
        p, width, h = layer_prefix(i), _width(c), c.hidden_size
        shapes = {}
        if i == 0:  # the model's, made once before the first layer reads its part
            shapes = {_TABLE: (c.hf.vocab_size_per_layer_input, c.num_layers * width),
                      _PROJECTION: (c.num_layers * width, h), _PROJECTION_NORM + ".weight": (width,)}
        return shapes | {p + "per_layer_input_gate.weight": (width, h), p + "per_layer_projection.weight": (h, width)}

    def names(self, options):
        return {"per_layer_input_gate.weight": True, "per_layer_projection.weight": True}

    def model_names(self, options):
        return {_TABLE: True, _PROJECTION: True, _PROJECTION_NORM + ".weight": True}

    def gathered(self, c, i):
        return [_TABLE] if i == 0 else []

    def build(self, g, x, i):
        if _INPUTS not in g.shared:
            g.shared[_INPUTS] = _model_inputs(g)
        p = layer_prefix(i)
        gate = linear(x, g.weight(p + "per_layer_input_gate.weight"), p + "per_layer_input_gate")
        gate = activation(g, gate, f"__module.{p}act_fn/aten::")
        mine = _ops().gather(g.shared[_INPUTS], const(i, np.int64), const(2, np.int64))  # [B, L, P]
        gated = named(_ops().multiply(gate, mine), f"__module.{p[:-1]}/aten::mul/Multiply_per_layer")
        return linear(gated, g.weight(p + "per_layer_projection.weight"), p + "per_layer_projection")


def _model_inputs(g):
    """Every layer's per-layer input [B, L, layers, P] (the module docstring's formula)."""
    ops, c = _ops(), g.config
    width = _width(c)
    split = const([0, 0, c.num_layers, width], np.int64)
    scope = "__module.model.embed_tokens_per_layer/aten::"
    ids = ops.convert(g.input_ids, "i32")
    table = named(ops.gather(g.weight(_TABLE), ids, const(0, np.int64)), scope + "embedding/Gather")
    # float32 scales, as the modules' buffers and Python floats times float32 tensors make them
    table = named(ops.multiply(table, const(np.float32(width ** 0.5))), scope + "mul/Multiply")
    table = ops.reshape(table, split, True)
    scope = "__module.model/aten::"
    projected = linear(g.embeddings, g.weight(_PROJECTION), "model.per_layer_model_projection")
    projected = named(ops.multiply(projected, const(np.float32(c.hidden_size ** -0.5))), scope + "mul/Multiply_ple")
    projected = g.norm(ops.reshape(projected, split, True), _PROJECTION_NORM + ".weight", _PROJECTION_NORM)
    summed = named(ops.add(projected, table), scope + "add/Add_ple")
    return named(ops.multiply(summed, const(np.float32(2.0 ** -0.5))), scope + "mul/Multiply_ple_1")
