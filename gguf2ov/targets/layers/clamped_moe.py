"""gpt-oss's mixture of experts: transformers 5.5.4's GptOssMLP (GptOssTopKRouter, GptOssExperts), in
the two-GEMM tiled form OpenVINO's CPU plugin (x86-64) rewrites into two GatherMatmul per layer
(ConvertTiledMoeBlockTo2GatherMatmuls), the form optimum-intel 2.2.0 traces for gpt_oss:

    x [B, L, H] -> Reshape[-1, H] = h [T, H]
    router, f32: MatMul(h, W [E, H], tb) + bias -> Softmax -> TopK(k) -> Divide by ReduceSum
                 (the softmax of the top k logits, as GptOssTopKRouter computes it) -> the routing [E, T, 1]
    experts:     Tile -> Reshape[E, -1, H] -> MatMul(tb, gate_up [E, 2I, H]) -> Add(bias [E, 1, 2I])
                 -> gate: Slice(0::2) -> Minimum(limit) -> Swish(alpha)                        -+
                 -> up:   Slice(1::2) -> Clamp(-limit, limit) -> Add(1) ------------------------+-> Multiply
                 -> MatMul(tb, down [E, H, I]) -> Add(bias [E, 1, H]) -> Reshape[E, -1, H]
                 -> Multiply(routing) -> ReduceSum(0) -> Reshape to x's shape

The clamped SwiGLU is GptOssExperts._apply_gate's: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),
g = min(gate, limit); transformers states limit 7.0 and alpha 1.702 in the class (no config key), as
llama.cpp states them in its SWIGLU_OAI kernel; the map's forward options carry them.

The graph reads the experts as [E, N, K] (`mlp.experts.gate_up_nk`, gate and up rows interleaved as
the checkpoint's columns are, and `mlp.experts.down_nk`); `layouts` names where a source holds them:
transformers' checkpoint as [E, K, N] (`gate_up_proj`, `down_proj`), llama.cpp's file with gate and
up apart (`ffn_gate_exps`, `ffn_up_exps`, their biases too), taken in turn row by row. The bias
Adds must be there for the plugin's rewrite (with them constant-folded away the block stays dense).
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import const, linear, named
from ...ir.graph_ops import ops as _ops
from ..layouts import Interleaved, Transposed
from .kind import LayerKind
from .pieces import layer_prefix, route, swish, tile_tokens

# What the compiled model holds for a layer (x86-64 CPU plugin, openvino 2026.4.1): two GatherMatmul (gate and up
# fused, down), and nothing of the dense trace left
_COMPILED = {"GatherMatmul": 2, "Tile": 0, "ScatterElementsUpdate": 0}


def _params(c) -> dict:
    hf = c.hf
    return {"experts": int(getattr(hf, "num_local_experts", 0) or 0),
            "top_k": int(getattr(hf, "num_experts_per_tok", 0) or 0),
            "intermediate": int(getattr(hf, "intermediate_size", 0) or 0)}


class ClampedSwigluExperts(LayerKind, name="clamped_moe", role="mlp"):
    # what its router, routing and tiled experts add to the attention kind's layer figure (measured on 2- and
    # 4-layer gpt_oss targets: 80.8 KB a layer, the attention's 66.7 KB with sinks included)
    IR_XML_BYTES = 14_000
    OPTIONS = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}

    def check(self, c, where):
        p = _params(c)
        for key, value in (("num_local_experts", p["experts"]), ("num_experts_per_tok", p["top_k"]),
                           ("intermediate_size", p["intermediate"])):
            if value <= 0:
                raise Gguf2ovError(f"{where}: {key} is {value}, not a positive integer (a mixture-of-experts MLP)")
        if p["top_k"] > p["experts"]:
            raise Gguf2ovError(f"{where}: num_experts_per_tok is {p['top_k']}, above num_local_experts "
                               f"{p['experts']}: a token cannot choose more experts than there are")

    def tensors(self, c, i):
        p, m = layer_prefix(i) + "mlp.", _params(c)
        e, h, inter = m["experts"], c.hidden_size, m["intermediate"]
        return {p + "router.weight": (e, h), p + "router.bias": (e,),
                p + "experts.gate_up_nk": (e, 2 * inter, h), p + "experts.gate_up_proj_bias": (e, 2 * inter),
                p + "experts.down_nk": (e, h, inter), p + "experts.down_proj_bias": (e, h)}

    def names(self, options):
        """Every name the graph or a layout reads (which of a layout's a source holds, its layout decides)."""
        experts = ("gate_up_nk", "gate_up_proj_bias", "down_nk", "down_proj_bias", "gate_up_proj", "down_proj",
                   "gate_proj", "up_proj", "gate_proj_bias", "up_proj_bias")
        return {"mlp.router.weight": True, "mlp.router.bias": True} | {f"mlp.experts.{n}": False for n in experts}

    def layouts(self, c, i):
        """transformers' [E, K, N] experts; llama.cpp's gate and up apart (weights and biases)."""
        p, m = layer_prefix(i) + "mlp.experts.", _params(c)
        e, h, inter = m["experts"], c.hidden_size, m["intermediate"]
        return {p + "gate_up_nk": [Transposed(p + "gate_up_proj", (e, h, 2 * inter)),
                                   Interleaved((p + "gate_proj", p + "up_proj"), (e, inter, h))],
                p + "down_nk": [Transposed(p + "down_proj", (e, inter, h))],
                p + "gate_up_proj_bias": [Interleaved((p + "gate_proj_bias", p + "up_proj_bias"), (e, inter))]}

    def kept(self, c, i):
        """The router stays float32 in every format (llama.cpp never quantizes ffn_gate_inp)."""
        return [layer_prefix(i) + "mlp.router.weight"]

    def batched(self, c, i):
        p = layer_prefix(i) + "mlp.experts."
        return [p + "gate_up_nk", p + "down_nk"]

    def compiled(self, c, i):
        return dict(_COMPILED)

    def probe(self, c, layers, width):
        return {"intermediate_size": width}

    def build(self, g, x, i):
        c = g.config
        ops, m, i64 = _ops(), _params(c), np.int64
        e, h, inter = m["experts"], c.hidden_size, m["intermediate"]
        limit, alpha = float(c.options["swiglu_limit"]), float(c.options["swiglu_alpha"])
        p = layer_prefix(i) + "mlp."
        s = f"__module.{p[:-1]}"
        flat = named(ops.reshape(x, const([-1, h], i64), False), f"{s}/aten::view/Reshape")  # [T, H]

        logits = linear(flat, g.weight(p + "router.weight"), p + "router", g.vector(p + "router.bias"))
        routing = route(logits, m["top_k"], True, e, s)  # [E, T, 1]
        tiled = tile_tokens(flat, e, h, s)  # [E, T, H]

        def bmm(inp, name, bias, width, suffix):
            y = named(ops.matmul(inp, g.weight(p + "experts." + name), False, True),
                      f"{s}.experts/aten::bmm/MatMul{suffix}")
            return ops.add(y, const(g.vector(p + "experts." + bias).reshape(e, 1, width)))

        gate_up = bmm(tiled, "gate_up_nk", "gate_up_proj_bias", 2 * inter, "")  # [E, T, 2I], gate and up in turn

        def every_other(start):
            return ops.slice(gate_up, const([start], i64), const([2 * inter], i64), const([2], i64),
                             const([2], i64))

        gate = named(swish(ops.minimum(every_other(0), const(limit)), alpha), f"{s}.experts/aten::mul/Swish")
        up = ops.add(ops.clamp(every_other(1), -limit, limit), const(1.0))
        act = named(ops.multiply(up, gate), f"{s}.experts/aten::mul/Multiply")
        down = ops.reshape(bmm(act, "down_nk", "down_proj_bias", h, "_1"), const([e, -1, h], i64), False)
        weighted = named(ops.multiply(down, routing), f"{s}.experts/aten::mul/Multiply_1")
        out = named(ops.reduce_sum(weighted, const([0], i64), False), f"{s}.experts/aten::sum/ReduceSum")  # [T, H]
        return named(ops.reshape(out, ops.shape_of(x, "i64"), False), f"{s}/aten::reshape/Reshape")
