"""A decoder layer's output scale: Gemma 4's `layer_scalar` (transformers 5.5.4's Gemma4TextDecoderLayer
multiplies its whole output, the residual stream, by this one number, a buffer the checkpoint saves).
A map places it as a step whose output replaces the stream (`residual: false`)."""

from ...ir.graph_ops import const, named
from ...ir.graph_ops import ops as _ops
from .kind import LayerKind
from .pieces import layer_prefix


class LayerScalar(LayerKind, name="layer_scalar", role="block"):
    def tensors(self, c, i):
        return {layer_prefix(i) + "layer_scalar": (1,)}

    def names(self, options):
        return {"layer_scalar": True}

    def build(self, g, x, i):
        p = layer_prefix(i)
        scale = const(g.vector(p + "layer_scalar").reshape(1))
        return named(_ops().multiply(x, scale), f"__module.{p[:-1]}/aten::mul_/Multiply")
