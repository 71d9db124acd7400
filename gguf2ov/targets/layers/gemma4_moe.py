"""Gemma 4's feed-forward block: the dense gated MLP, and where the config sets enable_moe_block (Gemma 4
26B-A4B) a mixture of experts beside it, as transformers 5.5.4's Gemma4TextDecoderLayer computes it
and llama.cpp 0c1e570 (src/models/gemma4.cpp) builds it. The block reads the residual stream x itself
(the map's step puts no norm before it), since the router reads x un-normed:

    dense:   post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(x)))      (the MLP alone without MoE;
             twice intermediate_size wide in the shared-KV layers where use_double_wide_mlp is set: E2B)
    router:  RMSNorm(x) without weight * router.scale * hidden_size^-0.5 -> proj [E, H]
             -> softmax over every expert -> top k -> renormalised -> * per_expert_scale[chosen]
    experts: post_feedforward_layernorm_2(sum_k w_k down_k(gelu_tanh(gate_k(h)) * up_k(h))),
             h = pre_feedforward_layernorm_2(x)
    output:  dense + experts (the map's post_feedforward_layernorm follows, then the residual add)

llama.cpp's file states the same: its router's input is attn_out through ggml_rms_norm, scaled by
1/sqrt(n_embd) and ffn_gate_inp.scale; per_expert_scale is ffn_down_exps.scale, which multiplies each
chosen expert's output (the same as its routing weight, the down projection being linear); softmax
gating with the top k renormalised (build_moe_ffn norm_w); GELU on the gate of every expert and of
the dense MLP; the branches summed before ffn_post_norm.

The experts are the tiled form OpenVINO's CPU plugin rewrites into three GatherMatmul per layer
(`pieces.expert_mlps`, `moe.py`), read as [E, N, K] gate_proj, up_proj and down_proj; a checkpoint
and llama.cpp's converter store gate and up fused along the rows (`experts.gate_up_proj`, gate first,
as Gemma4TextExperts chunks it), which `layouts` names. The router's weight stays float32 in every
format, as llama.cpp never quantizes ffn_gate_inp.
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import const, linear, named, rms_norm
from ...ir.graph_ops import ops as _ops
from ..layouts import Split
from .kind import LayerKind
from .pieces import check_dense_width, expert_mlps, gated_mlp, gated_mlp_names, gated_mlp_tensors, layer_prefix, route

# What the compiled model holds for a layer with experts (x86-64 CPU plugin, openvino 2026.4.1): three
# GatherMatmul, and nothing of the dense trace left
_COMPILED = {"GatherMatmul": 3, "Tile": 0, "ScatterElementsUpdate": 0}
_MOE_NORMS = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")


def _params(c) -> dict:
    """The config's mixture-of-experts settings (transformers' Gemma4TextConfig names; 0 without)."""
    hf = c.hf
    return {"moe": bool(getattr(hf, "enable_moe_block", False)),
            "experts": int(getattr(hf, "num_experts", 0) or 0),
            "top_k": int(getattr(hf, "top_k_experts", 0) or 0),
            "intermediate": int(getattr(hf, "moe_intermediate_size", 0) or 0)}


def _dense_width(c, i: int) -> int:
    """The dense MLP's width in layer i: twice intermediate_size in the shared-KV layers where the config sets
    use_double_wide_mlp (E2B), as Gemma4TextMLP makes it (layer_idx >= num_hidden_layers - num_kv_shared_layers > 0)."""
    first_shared = c.num_layers - (getattr(c.hf, "num_kv_shared_layers", 0) or 0)
    wide = bool(getattr(c.hf, "use_double_wide_mlp", False)) and i >= first_shared > 0
    return c.intermediate_size * (2 if wide else 1)


class Gemma4FeedForward(LayerKind, name="gemma4_moe", role="mlp"):
    # what the router, routing and tiled experts add to a layer's figure (the attention kind's counts the
    # dense MLP): moe.py's measured figure, an over-estimate for a dense Gemma 4 (a disk estimate)
    IR_XML_BYTES = 14_000

    def check(self, c, where):
        check_dense_width(c, where)
        m = _params(c)
        if not m["moe"]:
            return
        for key, value in (("num_experts", m["experts"]), ("top_k_experts", m["top_k"]),
                           ("moe_intermediate_size", m["intermediate"])):
            if value <= 0:
                raise Gguf2ovError(f"{where}: {key} is {value}, not a positive integer (enable_moe_block: a "
                                   "mixture of experts)")
        if m["top_k"] > m["experts"]:
            raise Gguf2ovError(f"{where}: top_k_experts is {m['top_k']}, above num_experts {m['experts']}: a token "
                               "cannot choose more experts than there are")

    def tensors(self, c, i):
        p, m, h = layer_prefix(i), _params(c), c.hidden_size
        shapes = {p + "pre_feedforward_layernorm.weight": (h,),
                  **gated_mlp_tensors(p + "mlp.", h, _dense_width(c, i), c.mlp_bias)}
        if not m["moe"]:
            return shapes
        e, inter = m["experts"], m["intermediate"]
        return shapes | {p + "post_feedforward_layernorm_1.weight": (h,), p + "router.scale": (h,),
                         p + "router.proj.weight": (e, h), p + "router.per_expert_scale": (e,),
                         p + "pre_feedforward_layernorm_2.weight": (h,), p + "experts.gate_proj": (e, inter, h),
                         p + "experts.up_proj": (e, inter, h), p + "experts.down_proj": (e, h, inter),
                         p + "post_feedforward_layernorm_2.weight": (h,)}

    def names(self, options):
        """The dense MLP's always; the experts' as the config says (and the fused gate_up_proj of `layouts`)."""
        moe = [f"{n}.weight" for n in _MOE_NORMS] + ["router.scale", "router.proj.weight", "router.per_expert_scale"]
        moe += [f"experts.{n}" for n in ("gate_proj", "up_proj", "down_proj", "gate_up_proj")]
        return {"pre_feedforward_layernorm.weight": True} | gated_mlp_names("mlp.") | {n: False for n in moe}

    def layouts(self, c, i):
        """gate and up fused along the rows, gate first (a checkpoint's and llama.cpp's `ffn_gate_up_exps`)."""
        m = _params(c)
        if not m["moe"]:
            return {}
        p, e, inter = layer_prefix(i) + "experts.", m["experts"], m["intermediate"]
        fused = (e, 2 * inter, c.hidden_size)
        return {p + "gate_proj": [Split(p + "gate_up_proj", fused, 0, inter)],
                p + "up_proj": [Split(p + "gate_up_proj", fused, inter, 2 * inter)]}

    def kept(self, c, i):
        """The router's weight stays float32 in every format."""
        return [layer_prefix(i) + "router.proj.weight"] if _params(c)["moe"] else []

    def batched(self, c, i):
        if not _params(c)["moe"]:
            return []
        p = layer_prefix(i) + "experts."
        return [p + "gate_proj", p + "up_proj", p + "down_proj"]

    def compiled(self, c, i):
        return dict(_COMPILED) if _params(c)["moe"] else {}

    def probe(self, c, layers, width):
        return {"moe_intermediate_size": width} if _params(c)["moe"] else {}

    def build(self, g, x, i):
        c, m, p = g.config, _params(g.config), layer_prefix(i)
        dense = gated_mlp(g, g.norm(x, p + "pre_feedforward_layernorm.weight", p + "pre_feedforward_layernorm"),
                          p + "mlp.", c.mlp_bias)
        if not m["moe"]:
            return dense
        ops, e, h, i64 = _ops(), m["experts"], c.hidden_size, np.int64
        s = f"__module.{p[:-1]}"
        dense = g.norm(dense, p + "post_feedforward_layernorm_1.weight", p + "post_feedforward_layernorm_1")
        flat = named(ops.reshape(x, const([-1, h], i64), False), f"{s}/aten::reshape/Reshape")  # [T, H]

        # the router, in float32, on the stream un-normed: RMSNorm without weight, times router.scale and
        # hidden_size^-0.5 (folded into one factor)
        factor = g.vector(p + "router.scale") * np.float32(h ** -0.5)
        logits = linear(rms_norm(flat, factor, c.rms_norm_eps, p + "router.norm"), g.weight(p + "router.proj.weight"),
                        p + "router.proj")
        routing = route(logits, m["top_k"], True, e, s, g.vector(p + "router.per_expert_scale"))  # [E, T, 1]

        experts_in = g.norm(flat, p + "pre_feedforward_layernorm_2.weight", p + "pre_feedforward_layernorm_2")
        out = expert_mlps(g, experts_in, routing, p + "experts.", e, h, s)  # [T, H]
        out = named(ops.reshape(out, ops.shape_of(x, "i64"), False), f"{s}/aten::reshape/Reshape_1")
        out = g.norm(out, p + "post_feedforward_layernorm_2.weight", p + "post_feedforward_layernorm_2")
        return named(ops.add(dense, out), f"{s}/aten::add/Add_moe")
