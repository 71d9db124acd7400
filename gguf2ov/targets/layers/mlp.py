"""The dense gated MLP of a decoder layer: down(act(gate(x)) * up(x)), as transformers' LlamaMLP
(and Qwen's, Gemma's) computes it; biases where the config's mlp_bias says (`pieces.gated_mlp`)."""

from .kind import LayerKind
from .pieces import check_dense_width, gated_mlp, gated_mlp_names, gated_mlp_tensors, layer_prefix


class DenseMLP(LayerKind, name="dense", role="mlp"):
    # IR_XML_BYTES 0: counted in the mixer's layer figure (Attention.IR_XML_BYTES)

    def check(self, c, where):
        check_dense_width(c, where)

    def tensors(self, c, i):
        return gated_mlp_tensors(layer_prefix(i) + "mlp.", c.hidden_size, c.intermediate_size, c.mlp_bias)

    def names(self, options):
        return gated_mlp_names("mlp.")

    def build(self, g, x, i):
        return gated_mlp(g, x, layer_prefix(i) + "mlp.", g.config.mlp_bias)
