"""The dense gated MLP of a decoder layer: down(act(gate(x)) * up(x)), as transformers' LlamaMLP
(and Qwen's, Gemma's) computes it; biases where the config's mlp_bias says."""

from ...errors import Gguf2ovError
from ...ir.graph_ops import linear, named
from ...ir.graph_ops import ops as _ops

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
IR_XML_BYTES = 0  # counted in the mixer's layer figure (attention.IR_XML_BYTES)


def check(c, where) -> None:
    """Refuse a config that states no width for the dense MLP (target_config lets one without it
    through: a mixture-of-experts model has no dense MLP)."""
    if c.intermediate_size <= 0:
        raise Gguf2ovError(f"{where}: intermediate_size is missing: the width of a dense MLP")


def tensors(c, i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}.mlp."
    h, inter = c.hidden_size, c.intermediate_size
    shapes = {}
    for name, out, inp in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)):
        shapes[p + name + ".weight"] = (out, inp)
        if c.mlp_bias:
            shapes[p + name + ".bias"] = (out,)
    return shapes


def build(g, x, i: int):
    ops, c = _ops(), g.config
    p = f"model.layers.{i}.mlp."

    def project(name, inp):
        return linear(inp, g.weight(p + name + ".weight"), p + name, g.bias(p + name + ".bias", c.mlp_bias))

    gate = project("gate_proj", x)
    scope = f"__module.{p}act_fn/aten::"
    gate = named(ops.swish(gate), scope + "silu/Swish") if c.activation == "silu" else \
        named(ops.gelu(gate, "tanh"), scope + "gelu/Gelu")
    up = project("up_proj", x)
    return project("down_proj", named(ops.multiply(gate, up), f"__module.{p[:-1]}/aten::mul/Multiply"))


def states(c, i: int) -> list[str]:
    return []
