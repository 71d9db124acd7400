"""The Gated DeltaNet mixer ("linear attention") of Qwen3.5's hybrid layers: transformers 5.5.4's
Qwen3_5GatedDeltaNet, in the op sequence optimum-intel 2.2.0's patch traces (Qwen3_5ModelPatcher) and
OpenVINO 2026.4.1's fusions match.

qkv = in_proj_qkv(x) -> a causal depthwise conv over the cached last K inputs -> silu -> q | k | v;
q and k repeated to the value heads (value head j reads key head j // r, repeat_interleave's grouped
order), L2-normed and q scaled by dk^-0.5; g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias),
beta = sigmoid(in_proj_b(x)); the delta rule over the recurrent state [B, nv, dk, dv], token by
token; RMSNorm(w) * silu(in_proj_z(x)) per value head; out_proj.

Two state variables per linear layer, named and shaped as optimum's (numbered by linear layer):
`cache_params.past.conv.{j}cache_params.present.conv.{j}` [B, C, K] and `...ssm.{j}...` [B, nv, dk, dv],
ReadValues initialised with zeros (GenAI tells the cache kinds apart by the initialiser's shape) and
reordered by `beam_idx`.

What the fusions need, each measured (a deviation leaves the Loop or the conv state unfused, and then
OpenVINO's paged conversion fails or DFlash refuses the unmanaged state):
- CPU GatedDeltaNetFusion turns the Loop into one GatedDeltaNet only if the Loop is optimum's
  `convert_recurrent_attention_cell` op for op and q reaches it as Divide(q, Power(Convert(Gather(
  ShapeOf(q), 3)), 0.5)) directly (a constant scale is not matched);
- its grouped-query fold needs the L2 norm as x * (1 / Sqrt(ReduceSum(x * x) + eps)) and q, k, v from
  one VariadicSplit through Reshape/Gather/Transpose only. The fold drops the repeat without reading
  its indices (the kernel groups j // r itself): the weights must be in transformers' grouped head
  order, so a GGUF's tiled V heads are un-tiled by the map, never compensated in the graph;
- PagedCausalConv1DFusion matches Concat(axis -1, the attribute itself) -> GroupConvolution (a static
  [C, 1, 1, K] weight) -> Slice on a ReadValue (through its Gather);
- PagedGatedDeltaNetFusion reshapes the fused op's output to q's head count, which is nk once the
  fold has un-repeated q: the output is flattened to [-1, dv] right behind the Loop, as optimum's
  trace does, before any per-head op (a [B, L, nv, dv] consumer fails the paged shape inference when
  nk != nv).
"""

import numpy as np

from ...errors import Gguf2ovError
from ...ir.graph_ops import I64_MAX, const, dim, linear, named, rms_norm
from ...ir.graph_ops import ops as _ops
from ...maps.rules import is_int
from .kind import LayerKind
from .pieces import cache_state, layer_prefix, ordinal

# FLA's l2norm epsilon, fixed in transformers' recurrent kernel (use_qk_l2norm_in_kernel), not rms_norm_eps
_L2NORM_EPS = 1e-6
_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def _geometry(c) -> dict:
    """nk, nv key/value heads of dk, dv; K the conv kernel; C the conv channels (q | k | v)."""
    hf = c.hf
    nk, nv = hf.linear_num_key_heads, hf.linear_num_value_heads
    dk, dv = hf.linear_key_head_dim, hf.linear_value_head_dim
    return {"nk": nk, "nv": nv, "dk": dk, "dv": dv, "K": hf.linear_conv_kernel_dim, "C": 2 * nk * dk + nv * dv}


class GatedDeltaNet(LayerKind, name="gated_deltanet", role="mixer"):
    RECURRENT = True
    # a Gated DeltaNet layer with a dense MLP, weights' decompression aside (measured on 4- and 8-layer
    # qwen3_5_text targets, L L L F and L F L F)
    IR_XML_BYTES = 96_500
    INT8_WHY = ("Gated DeltaNet projections (int4 makes these layers' output incoherent: optimum-intel#1722, "
                "openvino.genai#3870 and #4467, nncf#4217)")

    def check(self, c, where):
        """Refuse a config whose linear layers cannot be built."""
        keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim")
        values = {k: getattr(c.hf, k, None) for k in keys}
        if bad := [f"{k} = {v!r}" for k, v in values.items() if not (is_int(v) and v > 0)]:
            raise Gguf2ovError(f"{where}: linear attention needs positive integers: {', '.join(bad)}")
        if values["linear_num_value_heads"] % values["linear_num_key_heads"]:
            raise Gguf2ovError(f"{where}: {values['linear_num_value_heads']} linear value heads do not split into "
                               f"{values['linear_num_key_heads']} key heads")

    def tensors(self, c, i):
        p = layer_prefix(i) + "linear_attn."
        d, h = _geometry(c), c.hidden_size
        vd = d["nv"] * d["dv"]
        return {p + "in_proj_qkv.weight": (d["C"], h), p + "conv1d.weight": (d["C"], 1, d["K"]),
                p + "in_proj_b.weight": (d["nv"], h), p + "in_proj_a.weight": (d["nv"], h), p + "A_log": (d["nv"],),
                p + "dt_bias": (d["nv"],), p + "in_proj_z.weight": (vd, h), p + "norm.weight": (d["dv"],),
                p + "out_proj.weight": (h, vd)}

    def names(self, options):
        return {f"linear_attn.{n}": True for n in ("in_proj_qkv.weight", "conv1d.weight", "in_proj_b.weight",
                                                   "in_proj_a.weight", "A_log", "dt_bias", "in_proj_z.weight",
                                                   "norm.weight", "out_proj.weight")}

    def int8_weights(self, c, i):
        """The projections that NNCF's int4 must not take (INT8_WHY); int8 is fine."""
        return [f"{layer_prefix(i)}linear_attn.{name}.weight" for name in _PROJECTIONS]

    def build(self, g, x, i):
        ops, c = _ops(), g.config
        d = _geometry(c)
        nk, nv, dk, dv, k_size = d["nk"], d["nv"], d["dk"], d["dv"], d["K"]
        j = ordinal(c, i)
        s = layer_prefix(i) + "linear_attn"
        p, a_ = s + ".", f"__module.{s}/aten::"

        qkv = linear(x, g.weight(p + "in_proj_qkv.weight"), s + ".in_proj_qkv")                     # [B, L, C]
        qkv = named(ops.transpose(qkv, const([0, 2, 1], np.int64)), a_ + "transpose/Transpose")       # [B, C, L]
        past = _linear_state(cache_state(j, "conv"), g.batch, (d["C"], k_size), g.beam_idx)
        mixed, conv_state = _causal_conv1d(qkv, g.vector(p + "conv1d.weight"), past, s)
        mixed = named(ops.transpose(mixed, const([0, 2, 1], np.int64)), a_ + "transpose/Transpose_1")  # [B, L, C]
        q, k, v = named(ops.variadic_split(mixed, const(-1, np.int64), const([nk * dk, nk * dk, nv * dv], np.int64)),
                        a_ + "split_with_sizes/VariadicSplit").outputs()

        v = _bhld(_heads(v, nv, dv))                                                                 # [B, nv, L, dv]
        q, k = _heads(q, nk, dk), _heads(k, nk, dk)
        if nv != nk:
            grouped = const(np.repeat(np.arange(nk), nv // nk), np.int64)  # value head j reads key head j // r
            q = named(ops.gather(q, grouped, const(2, np.int64)), a_ + "repeat_interleave/Gather_1")
            k = named(ops.gather(k, grouped, const(2, np.int64)), a_ + "repeat_interleave/Gather_3")
        q, k = _bhld(_l2_norm(q)), _bhld(_l2_norm(k))                                                 # [B, nv, L, dk]
        head_size = ops.convert(ops.gather(ops.shape_of(q, "i64"), const(3, np.int64), const(0, np.int64)), "f32")
        q = named(ops.divide(q, ops.power(head_size, const(0.5))), a_ + "mul/Multiply_3")

        b = linear(x, g.weight(p + "in_proj_b.weight"), s + ".in_proj_b")
        beta = ops.transpose(named(ops.sigmoid(b), a_ + "sigmoid/Sigmoid"), const([0, 2, 1], np.int64))   # [B, nv, L]
        a = linear(x, g.weight(p + "in_proj_a.weight"), s + ".in_proj_a")
        a_log = np.asarray(g.vector(p + "A_log"), np.float32)
        dt_bias = np.asarray(g.vector(p + "dt_bias"), np.float32)
        softplus = named(ops.softplus(ops.add(a, const(dt_bias))), a_ + "softplus/SoftPlus")
        # -exp(A_log) in float32, as transformers computes it (A_log.float().exp())
        decay = named(ops.multiply(const(_negated_exp(a_log, p + "A_log")), softplus), a_ + "mul/Multiply_6")
        decay = ops.transpose(decay, const([0, 2, 1], np.int64))                                      # [B, nv, L]

        state = _linear_state(cache_state(j, "ssm"), g.batch, (nv, dk, dv), g.beam_idx)
        out, final = _recurrent_cell(q, k, v, decay, beta, state)
        g.sinks += [_assign(conv_state, cache_state(j, "conv")), _assign(final, cache_state(j, "ssm"))]

        flat = const([-1, dv], np.int64)  # right behind the Loop: see the module docstring
        out = ops.reshape(_bhld(out), flat, False)
        z = ops.reshape(_heads(linear(x, g.weight(p + "in_proj_z.weight"), s + ".in_proj_z"), nv, dv), flat, False)
        normed = rms_norm(out, np.asarray(g.vector(p + "norm.weight"), np.float32), c.rms_norm_eps, s + ".norm")
        gated = named(ops.multiply(normed, named(ops.swish(z), f"__module.{s}.norm/aten::silu/Swish")),
                      f"__module.{s}.norm/aten::mul/Multiply_2")
        rows = ops.gather(ops.shape_of(x, "i64"), const([0, 1], np.int64), const(0, np.int64))
        gated = ops.reshape(gated, ops.concat([rows, const([nv * dv], np.int64)], 0), False)
        out_proj = g.weight(p + "out_proj.weight")
        # a GGUF's grid keeps its tiled value-head columns: the product takes the heads in that order
        return linear(g.ordered_input(gated, p + "out_proj.weight"), out_proj, s + ".out_proj")

    def states(self, c, i):
        j = ordinal(c, i)
        return [cache_state(j, "conv"), cache_state(j, "ssm")]

    def paged(self, c, i):
        """A PagedGatedDeltaNet with its recurrent state table [?, nv, dv, dk] (the pass swaps the last two
        dimensions) and a PagedCausalConv1D with its conv state table [?, C, K]."""
        d, j = _geometry(c), ordinal(c, i)
        recurrent = (f"gated_delta_state_table.{j}", [-1, d["nv"], d["dv"], d["dk"]])
        return [{"op": "PagedGatedDeltaNet", "table": recurrent},
                {"op": "PagedCausalConv1D", "table": (f"conv_state_table.{j}", [-1, d["C"], d["K"]])}]


# --- pieces -----------------------------------------------------------------------------------------

def _negated_exp(a_log: np.ndarray, name: str) -> np.ndarray:
    """-exp(A_log) in float32; an A_log whose exp is beyond float32 (above ~88.7) is refused by name."""
    with np.errstate(over="ignore", invalid="ignore"):
        decay = -np.exp(a_log)
    if bad := int(np.count_nonzero(np.isfinite(a_log) & ~np.isfinite(decay))):
        from ...finite import nonfinite_error

        raise nonfinite_error(name, bad, a_log.size, "exp(A_log) values", too_large_for="float32")
    return decay


def _heads(x, count: int, size: int):  # [B, L, count * size] -> [B, L, count, size]
    return _ops().reshape(x, const([0, 0, count, size], np.int64), True)


def _bhld(x):  # [B, L, H, d] <-> [B, H, L, d]
    return _ops().transpose(x, const([0, 2, 1, 3], np.int64))


def _linear_state(name: str, batch, dims: tuple, beam_idx):
    """A conv or recurrent state: a ReadValue initialised with zeros [batch, *dims], reordered by
    beam_idx (GenAI reads the cache kind from the initialiser's partial shape: rank 3 with one dynamic
    dimension is a conv state, rank 4 without a zero one a recurrent state)."""
    from openvino import opset6

    ops = _ops()
    init = ops.broadcast(const(0.0), ops.concat([batch, const(list(dims), np.int64)], 0))
    past = opset6.read_value(init, name, np.float32, [-1, *dims])
    return ops.gather(past, beam_idx, const(0, np.int64))


def _causal_conv1d(x, kernel: np.ndarray, past, scope: str):
    """(silu(conv) [B, C, L], the new state [B, C, K]) of optimum's ov_causal_conv1d: the cached last K
    inputs and `x` [B, C, L] joined, a depthwise conv without padding, its last L outputs; the state is
    the join's last K columns."""
    ops = _ops()
    channels, _, k = kernel.shape
    p = f"__module.{scope}/aten::"
    joined = named(ops.concat([past, x], -1), p + "cat/Concat")
    w = named(const(np.ascontiguousarray(kernel, np.float32).reshape(channels, 1, 1, k)), p + "_convolution/Reshape")
    conv = named(ops.group_convolution(joined, w, [1], [0], [0], [1]), p + "_convolution/GroupConvolution")
    out = named(ops.slice(conv, ops.negative(dim(x, 2)), const([I64_MAX], np.int64), const([1], np.int64),
                          const([2], np.int64)), p + "slice/Slice_2")
    state = ops.slice(joined, const([-k], np.int64), const([I64_MAX], np.int64), const([1], np.int64),
                      const([2], np.int64))
    return named(ops.swish(out), p + "silu/Swish"), state


def _l2_norm(x, eps: float = _L2NORM_EPS):
    """FLA's l2norm, x * (1 / Sqrt(ReduceSum(x * x, -1, keep) + eps)): the form FuseL2NormIntoGDN folds."""
    ops = _ops()
    total = ops.reduce_sum(ops.multiply(x, x), const([-1], np.int64), True)
    return ops.multiply(x, ops.divide(const(1.0), ops.sqrt(ops.add(total, const(eps)))))


def _recurrent_cell(query, key, value, g, beta, state):
    """(output [B, H, L, dv], final state [B, H, dk, dv]) of the delta rule, a v5 Loop over the tokens:
    optimum's convert_recurrent_attention_cell (_ov_ops.py) op for op. Inputs [trip count, cond, q, k,
    v, g, beta, state, output buffer], q/k/v/g/beta sliced on axis 2, body results [cond, state, output]:
    S <- exp(g) S; delta = beta (v - k^T S); S <- S + k delta^T; o = q^T S."""
    import openvino as ov
    from openvino import opset14 as o

    value_shape = o.shape_of(value)
    out_buffer = o.broadcast(o.constant(0, dtype=np.float32), value_shape)
    seq_len = o.gather(value_shape, o.constant(2, dtype=np.int32), o.constant(0, dtype=np.int32))

    timestep = o.parameter([], np.int32, "timestep")
    q_t, k_t, v_t = (o.parameter([-1, -1, 1, -1], np.float32, n) for n in ("q_t", "k_t", "v_t"))
    g_t = o.parameter([-1, -1, 1], np.float32, "g_t")
    beta_t = o.parameter([-1, -1, 1], np.float32, "beta_t")
    state_t = o.parameter([-1, -1, -1, -1], np.float32, "last_recurrent_state_t")
    out_t = o.parameter([-1, -1, -1, -1], np.float32, "core_attn_out_t")

    two, minus_one, minus_two = (o.constant(v, dtype=np.int32) for v in (2, -1, -2))
    q1, k1, v1 = o.squeeze(q_t, two), o.squeeze(k_t, two), o.squeeze(v_t, two)
    decayed = o.multiply(state_t, o.unsqueeze(o.exp(g_t), minus_one))
    k_col = o.unsqueeze(k1, minus_one)
    kv_mem = o.reduce_sum(o.multiply(decayed, k_col), minus_two, False)
    delta = o.multiply(o.subtract(v1, kv_mem), beta_t)
    updated = o.add(decayed, o.multiply(k_col, o.unsqueeze(delta, minus_two)))
    step_out = o.reduce_sum(o.multiply(updated, o.unsqueeze(q1, minus_one)), minus_two, True)
    written = o.scatter_update(out_t, o.unsqueeze(timestep, o.constant(0, dtype=np.int32)), step_out, two)
    body = ov.Model([o.constant([True], dtype=bool), updated, written],
                    [timestep, q_t, k_t, v_t, g_t, beta_t, state_t, out_t], "body_model")

    loop = o.loop(o.convert(seq_len, "i32"), o.constant(True, dtype="bool"))
    loop.set_function(body)
    for param, source in ((q_t, query), (k_t, key), (v_t, value), (g_t, g), (beta_t, beta)):
        loop.set_sliced_input(param, _output(source), 0, 1, 1, -1, 2)
    loop.set_merged_input(state_t, _output(state), updated.output(0))
    loop.set_merged_input(out_t, out_buffer.output(0), written.output(0))
    loop.set_special_body_ports([0, 0])
    return loop.get_iter_value(written.output(0), -1), loop.get_iter_value(updated.output(0), -1)


def _assign(value, name: str):
    """An Assign (v6) of `value`, a node or any output of one (the binding takes single-output nodes)."""
    from openvino import opset6

    if hasattr(value, "get_node"):
        node = opset6.assign(const(0.0), name)
        node.input(0).replace_source_output(value)
        return node
    return opset6.assign(value, name)


def _output(x):
    """A node's single output (Loop's Python bindings take Outputs only)."""
    return x if hasattr(x, "get_node") else x.output(0)
