"""The mixture-of-experts MLP: transformers 5.5.4's Qwen3MoeSparseMoeBlock (and, with a shared expert,
Qwen3_5MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock), in the dense "tiled" op sequence optimum-intel
2.2.0 traces, which OpenVINO's CPU plugin (x86-64) rewrites at compile time into GatherMatmul, so
that only the chosen experts run (ConvertTiledMoeBlockTo3GatherMatmuls):

    x [B, L, H] -> Reshape[-1, H] = h [T, H]
    router, f32: MatMul(h, W [E, H], tb) -> Softmax -> TopK(k) [-> Divide by ReduceSum]   (norm_topk_prob)
                 -> ScatterElementsUpdate(zeros [T, E], indices, weights, axis 1) -> Transpose -> Reshape[E, -1]
                 -> Unsqueeze: the routing weights [E, T, 1], zero but for the chosen experts
    experts:     Tile(h, [E, 1]) -> Reshape[E, -1, H] -> MatMul(tb, gate [E, I, H]) -> Swish -+
                                                     -> MatMul(tb, up [E, I, H]) ------------+-> Multiply
                 -> MatMul(tb, down [E, H, I]) -> Reshape[E, -1, H] -> Multiply(routing) -> ReduceSum(0)
    [+ Sigmoid(MatMul(h, shared_expert_gate [1, H], tb)) * down(act(gate(h)) * up(h))]   (a shared expert)
    -> Reshape to x's shape

Every expert runs every token in the IR; the routing matrix zeroes the unchosen ones. GatherMatmul
itself cannot be written (an IR holding it cannot be read back: "unsupported opset: extension"), and
the rewrite matches this pattern exactly: a Swish with a beta input (what `opset4.swish` always
makes) or a ReduceSum keeping its axis leave the block dense, 13-30x slower per decode step at
Qwen3-30B-A3B's geometry. The expert weights must be Constants (or decompression subgraphs over
Constants that carry the expert axis: u4/u8/i8 codes [E, N, K/G, G] stay compressed on the fused
node); Parameters make compile_model fail. The router decides the routing and stays float32 in
every format, as llama.cpp keeps it (`ffn_gate_inp` is never quantized) and as an NNCF ignored
scope would keep it; so does a shared expert's gate.

The layers a config makes dense (Qwen3-MoE's `mlp_only_layers`, `decoder_sparse_step`) are the
dense MLP kind (`mlp.py`) with `intermediate_size`, as transformers builds them.

The experts are read as one [E, N, K] tensor each (`mlp.experts.gate_proj`, `up_proj`, `down_proj`,
GGUF ne {K, N, E}: no transpose); `layouts` names the other ways a source stores them.
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import const, linear, named
from ...ir.graph_ops import ops as _ops
from ..layouts import Split, Stack
from .kind import LayerKind
from .pieces import (check_dense_width, expert_mlps, gated_mlp, gated_mlp_names, gated_mlp_tensors, layer_prefix,
                     route, swish)

# What the compiled model holds for a sparse layer (x86-64 CPU plugin, openvino 2026.4.1): three
# GatherMatmul, and nothing of the dense trace (Tile, the routing scatter) left.
_COMPILED = {"GatherMatmul": 3, "Tile": 0, "ScatterElementsUpdate": 0}


def _params(c) -> dict:
    """The MoE settings of transformers' config (the qwen3_moe names; a shared expert's size is 0 without one)."""
    hf = c.hf
    return {"experts": int(getattr(hf, "num_experts", 0) or 0),
            "top_k": int(getattr(hf, "num_experts_per_tok", 0) or 0),
            "intermediate": int(getattr(hf, "moe_intermediate_size", 0) or 0),
            # Qwen3.5-MoE's router always renormalises (its config has no such key)
            "norm_topk_prob": bool(getattr(hf, "norm_topk_prob", True)),
            "shared": int(getattr(hf, "shared_expert_intermediate_size", 0) or 0)}


def _sparse(c, i: int) -> bool:
    """Whether layer `i` is a mixture of experts, as transformers' Qwen3MoeDecoderLayer decides."""
    hf = c.hf
    only = getattr(hf, "mlp_only_layers", None) or []
    step = getattr(hf, "decoder_sparse_step", None) or 1
    return i not in only and _params(c)["experts"] > 0 and (i + 1) % step == 0


class MixtureOfExperts(LayerKind, name="moe", role="mlp"):
    # what a mixture-of-experts MLP adds to its layer's figure (the mixer's, with a dense MLP): its router,
    # routing and tiled experts (measured on 2- and 4-layer qwen3_moe targets against qwen3 ones of the same
    # widths: 14 KB a layer)
    IR_XML_BYTES = 14_000

    def check(self, c, where):
        """Refuse a config the block cannot be built from (one error line)."""
        p = _params(c)
        for key, value in (("num_experts", p["experts"]), ("num_experts_per_tok", p["top_k"]),
                           ("moe_intermediate_size", p["intermediate"])):
            if value <= 0:
                raise Gguf2ovError(f"{where}: {key} is {value}, not a positive integer (a mixture-of-experts MLP)")
        if p["top_k"] > p["experts"]:
            raise Gguf2ovError(f"{where}: num_experts_per_tok is {p['top_k']}, above num_experts {p['experts']}: a "
                               "token cannot choose more experts than there are")
        if c.activation != "silu":
            raise Gguf2ovError(f"{where}: a mixture-of-experts MLP with activation {c.activation} is not supported "
                               "(silu)")
        if any(not _sparse(c, i) for i in range(c.num_layers)):
            check_dense_width(c, where)  # the layers the config makes dense

    def tensors(self, c, i):
        p, m = layer_prefix(i) + "mlp.", _params(c)
        if not _sparse(c, i):
            return gated_mlp_tensors(p, c.hidden_size, c.intermediate_size, c.mlp_bias)
        e, h, inter = m["experts"], c.hidden_size, m["intermediate"]
        shapes = {p + "gate.weight": (e, h), p + "experts.gate_proj": (e, inter, h),
                  p + "experts.up_proj": (e, inter, h), p + "experts.down_proj": (e, h, inter)}
        if m["shared"]:
            s = m["shared"]
            shapes.update({p + "shared_expert.gate_proj.weight": (s, h), p + "shared_expert.up_proj.weight": (s, h),
                           p + "shared_expert.down_proj.weight": (h, s), p + "shared_expert_gate.weight": (1, h)})
        return shapes

    def names(self, options):
        """Every name but a checkpoint's per-expert ones (a layer may be dense, a shared expert absent: the
        config decides)."""
        experts = {f"mlp.experts.{n}": False for n in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")}
        shared = {f"mlp.shared_expert.{n}_proj.weight": False for n in ("gate", "up", "down")}
        return {n: False for n in gated_mlp_names("mlp.")} | {"mlp.gate.weight": False,
                                                              "mlp.shared_expert_gate.weight": False} | experts | shared

    def layouts(self, c, i):
        """The other layouts of the experts: one 2-D tensor per expert (save_pretrained's qwen3_moe keys, the
        hub's), or gate and up fused along the rows (`experts.gate_up_proj` [E, 2I, H], gate first)."""
        if not _sparse(c, i):
            return {}
        p, m = layer_prefix(i) + "mlp.experts.", _params(c)
        e, h, inter = m["experts"], c.hidden_size, m["intermediate"]

        def stack(name, shape):
            return Stack(tuple(f"{p}{x}.{name}.weight" for x in range(e)), shape)

        fused = (e, 2 * inter, h)
        return {p + "gate_proj": [stack("gate_proj", (inter, h)), Split(p + "gate_up_proj", fused, 0, inter)],
                p + "up_proj": [stack("up_proj", (inter, h)), Split(p + "gate_up_proj", fused, inter, 2 * inter)],
                p + "down_proj": [stack("down_proj", (h, inter))]}

    def kept(self, c, i):
        """The weights kept in float32 in every format: the router, a shared expert's gate."""
        if not _sparse(c, i):
            return []
        p = layer_prefix(i) + "mlp."
        return [p + "gate.weight"] + ([p + "shared_expert_gate.weight"] if _params(c)["shared"] else [])

    def batched(self, c, i):
        """The [E, N, K] weights of batched MatMuls (transpose_b), which NNCF compresses along K."""
        if not _sparse(c, i):
            return []
        p = layer_prefix(i) + "mlp.experts."
        return [p + "gate_proj", p + "up_proj", p + "down_proj"]

    def compiled(self, c, i):
        """What the compiled model must hold for this layer (`checks.compiled_finding`)."""
        return dict(_COMPILED) if _sparse(c, i) else {}

    def probe(self, c, layers, width):
        """Config keys of a smaller model of this kind (`probe.py`): the expert widths, and which of its
        layers (the target's `layers`) are dense."""
        m = _params(c)
        out = {"moe_intermediate_size": width, "decoder_sparse_step": 1,
               "mlp_only_layers": [j for j, i in enumerate(layers) if not _sparse(c, i)]}
        if m["shared"]:
            out["shared_expert_intermediate_size"] = width
        return out

    def build(self, g, x, i):
        c = g.config
        if not _sparse(c, i):
            return gated_mlp(g, x, layer_prefix(i) + "mlp.", c.mlp_bias)  # a layer the config makes dense
        ops, m = _ops(), _params(c)
        e, h = m["experts"], c.hidden_size
        p = layer_prefix(i) + "mlp."
        s = f"__module.{p[:-1]}"
        i64 = np.int64
        flat = named(ops.reshape(x, const([-1, h], i64), False), f"{s}/aten::view/Reshape")  # [T, H]

        # the router, in float32: softmax over every expert, the top k, renormalised; every token through
        # every expert, batched over E
        logits = linear(flat, g.weight(p + "gate.weight"), p + "gate")
        routing = route(logits, m["top_k"], m["norm_topk_prob"], e, s)  # [E, T, 1]
        out = expert_mlps(g, flat, routing, p + "experts.", e, h, s)  # [T, H]

        if m["shared"]:
            q = p + "shared_expert."
            sg = named(swish(linear(flat, g.weight(q + "gate_proj.weight"), q + "gate_proj")),
                       f"__module.{q}act_fn/aten::silu/Swish")
            shared = ops.multiply(sg, linear(flat, g.weight(q + "up_proj.weight"), q + "up_proj"))
            shared = linear(shared, g.weight(q + "down_proj.weight"), q + "down_proj")
            scale = ops.sigmoid(linear(flat, g.weight(p + "shared_expert_gate.weight"), p + "shared_expert_gate"))
            out = named(ops.add(out, ops.multiply(scale, shared)), f"{s}/aten::add/Add")
        return named(ops.reshape(out, ops.shape_of(x, "i64"), False), f"{s}/aten::reshape/Reshape")

