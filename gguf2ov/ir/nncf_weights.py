"""NNCF weight compression one weight at a time, equal to `nncf.compress_weights` on the whole model.

optimum-intel hands a whole fp32 model to `nncf.compress_weights`, which needs every weight in
f32 at once. The streamed export instead compresses each [out, in] weight as it
arrives. That is only the same model if every weight gets the settings NNCF's whole-model pass
would have given it, so this module splits that pass in two:

* `plan_modes(variant, weights, values)` makes NNCF's model-level decisions (nncf 3.4.0,
  nncf/quantization/algorithms/weight_compression/algorithm.py):
  - INT8_SYM / INT8_ASYM: every weight in int8, one scale (and zero point) per output channel
    (`_get_ratio_defining_params`, l. 549-550: in int8 modes every weight is ratio-defining;
    `get_weight_compression_configuration`, l. 92-93: group_size -1).
  - INT4_SYM / INT4_ASYM: every weight starts in the backup precision INT8_ASYM per channel
    (`get_weight_compression_parameters` l. 1059 with `_get_backup_config` l. 578-604; the
    default backup mode is INT8_ASYM, l. 108-114). The "ratio-defining" weights are then set to
    int4 with the group size (l. 1086-1088). Ratio-defining are the MatMul weights (embeddings
    are not) minus the LAST weighted MatMul in NNCF's topological order, unless all_layers=True
    (l. 552-561; embeddings join only with all_layers, l. 563-574), as documented in
    nncf/quantization/quantize_model.py l. 439-440 and 462-463 ("All embeddings and the last
    layer are always compressed to a backup precision"). The reason is accuracy: in an LLM the
    last MatMul is the lm_head and the first weight the embedding table, the layers most
    sensitive to 4-bit noise. NNCF does not check what the last MatMul is: a DFlash draft has
    neither an lm_head nor an embedding table, so what it keeps in int8 is simply the last
    decoder layer's mlp.down_proj. (If the last weighted node was skipped, e.g. it re-uses an
    earlier weight, no MatMul is moved to backup: l. 1002-1007, 1066, 560.)
  - ratio < 1 (data-free, no dataset): `DataFreeCriterion` (mixed_precision.py l. 127-199)
    scores every ratio-defining weight by 1 / (max over output channels of the mean squared
    error of INT8_ASYM per-channel quantize-dequantize + eps) and, walking the weights in
    ascending score order (stable sort, ties in topological order), puts them in int4 until
    the next one would bring the int4 share of ratio-defining parameters to >= ratio, then stops
    (l. 85-100: `break`, not `continue`). The rest go to backup int8 (algorithm.py l. 641-652).
    This needs each ratio-defining weight's f32 values once for scoring, before any weight is
    compressed: with ratio < 1 the source is read twice (score pass, then compress pass).
  - A primary (int4) weight whose input width is not a multiple of the group size makes NNCF
    raise (`validate_group_size`, l. 654-679, checked after the mixed-precision step); so
    does `plan_modes`.
  - RoPE's MatMul with a constant inv_freq is ignored by NNCF (`get_ignored_patterns`,
    openvino_backend.py l. 411-415) and stays f32: pass only Linear weights to `plan_modes`.

* `compress_weight(w, spec)` compresses one weight with NNCF's own code and returns the output
  of its decompression subgraph (f32 [out, in]), ready for `MatMul(x, W, transpose_b=True)`.
  It runs the public `nncf.compress_weights` on a one-MatMul model holding just this weight,
  with settings that make NNCF choose exactly `spec` (int4: ratio 1 and all_layers=True, so the
  lone MatMul is not kept in backup as "the last layer"). NNCF therefore quantizes with the
  same function (`weight_lowering.compress_weight`: an OpenVINO-compiled kernel for weights of
  >= 10000 elements, NumPy below, weight_lowering.py l. 693-708) and builds the same
  Convert -> (Subtract) -> Multiply -> (Reshape) -> Convert subgraph (openvino_backend.py
  l. 226-318) as in a whole-model run. The route keeps working if NNCF changes its kernels or
  subgraph, as long as a lone MatMul is compressed as it would be inside a model.
  `nncf_rt_info` / `write_nncf_rt_info` restore the `nncf.weight_compression` parameters that
  the whole-model run writes into the model's rt_info.

* A mixture of experts adds [E, N, K] expert weights, those of batched MatMuls (transpose_b):
  NNCF compresses them along K as it compresses a Linear weight (per (expert, row) channel, or per
  group along the row), so each is planned as a Linear is and compressed in a micro model with one
  batched MatMul; the expert axis is the one chunks are cut along.

* A target adds an embedding table (a Gather's weight): `plan_modes` keeps it in the backup int8
  in int4 modes unless all_layers, and knows that a tied lm_head re-uses it (then no MatMul is
  kept back as "the last layer"); `compress_weight(..., gather=True)` compresses it in a micro
  model with a Gather. `streamed_compression` compresses a weight in row chunks while the IR is
  written (per-channel and per-group quantization treat every row on its own, so the chunks give
  the whole weight's codes), and `streamed_sensitivity` scores it the same way.

Memory: the micro model wraps `w` without a copy (shared Constant) and NNCF reads it without a
copy; what is added is the quantization kernel's working memory (measured for a 4096 x 12288
weight: about 1.3x the f32 size for int8, 1.6x for int4 g16, the same as inside a whole-model
run) and the compressed constants. Nothing but the returned subgraph survives the call.
"""

import contextlib
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..errors import Gguf2ovError

INT8_ASYM, INT8_SYM, INT4_ASYM, INT4_SYM = "int8_asym", "int8_sym", "int4_asym", "int4_sym"
_NNCF_MODE_NAMES = {INT8_ASYM: "INT8_ASYM", INT8_SYM: "INT8_SYM", INT4_ASYM: "INT4_ASYM", INT4_SYM: "INT4_SYM"}
GROUP_SIZES = (16, 32, 64, 128)  # the int4 group sizes a refusal suggests (the drift variants' and optimum-cli's)


@dataclass(frozen=True)
class WeightSpec:
    """How NNCF compresses one weight: `mode` with `group_size` (-1: one scale per output channel)."""

    mode: str  # int8_asym | int8_sym | int4_asym | int4_sym
    group_size: int = -1
    reason: str = "primary"  # primary | backup: last MatMul | backup: ratio

    @property
    def bits(self) -> int:
        return 4 if self.mode.startswith("int4") else 8

    @property
    def sym(self) -> bool:
        return self.mode.endswith("_sym")

    @property
    def backup(self) -> bool:
        return self.reason.startswith("backup")

    @property
    def nncf_mode(self):
        import nncf

        return getattr(nncf.CompressWeightsMode, _NNCF_MODE_NAMES[self.mode])


def _primary_mode(variant) -> str:
    if not variant.nncf:
        raise Gguf2ovError(f"variant {variant.name!r} is not an NNCF weight compression (int8 / int4)")
    return f"int{variant.bits}_{'sym' if variant.sym else 'asym'}"


def _num_weights(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def sensitivity(w: np.ndarray) -> float:
    """NNCF's data-free mixed-precision score of one f32 [out, in] weight (lower goes to int4 first).

    `DataFreeCriterion._calc_weight_sensitivity` (mixed_precision.py l. 161-177) on the weight as
    the OpenVINO backend reads it (an openvino.Tensor, openvino_backend.py l. 428-432).
    """
    return 1 / (_quantization_error(w) + _EPS)


def streamed_sensitivity(rows_of, shape, elements: int | None = None) -> float:
    """`sensitivity` of a [rows, width] weight read in row chunks: NNCF's error is the largest of the
    rows' mean squared errors (weight_lowering.get_integer_quantization_error, "max_mean"), so the
    largest over the chunks is the whole weight's (an [E, N, K] weight's chunks are whole experts)."""
    rows, width = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    error = max(_quantization_error(rows_of(r0, r1)) for r0, r1 in row_chunks(rows, width, elements))
    return 1 / (error + _EPS)


# fns.finfo(weight).eps of a float32 weight, as DataFreeCriterion adds it
_EPS = float(np.finfo(np.float32).eps)


def _quantization_error(w: np.ndarray) -> float:
    import openvino as ov
    from nncf.quantization.algorithms.weight_compression.config import WeightCompressionConfig
    from nncf.quantization.algorithms.weight_compression.weight_lowering import get_integer_quantization_error
    from nncf.tensor import Tensor

    w = _as_f32_2d(np.asarray(w).reshape(-1, np.shape(w)[-1]))  # [E, N, K] experts: E * N channels
    weight = Tensor(ov.Tensor(w, w.shape, ov.Type.f32))
    return get_integer_quantization_error(weight, (1,), WeightCompressionConfig(), reduction="max_mean")


def plan_modes(variant, weights, values=None, scores: dict | None = None, embeddings=(),
               last_shared: bool = False, held: dict | None = None) -> dict[str, WeightSpec]:
    """{name: WeightSpec}: what whole-model `nncf.compress_weights` does to each weight for `variant`.

    `weights`: (name, shape) of every weight NNCF compresses, shape [out, in] for a Linear (consumed
    with transpose_b) and [rows, width] for an embedding table, in NNCF's topological order of the
    graph (`nncf_weight_order` reads it from a model); only the last MatMul's position matters
    unless ratio < 1 (then it breaks ties of equal scores). `embeddings` names the tables an
    embedding Gather reads: NNCF never counts them as ratio-defining without all_layers
    (algorithm.py l. 563-574), so in int4 modes they stay in the backup int8. `last_shared`: the
    model's last weighted MatMul re-uses an earlier weight (a target whose lm_head is tied to its
    embedding), so NNCF keeps no MatMul back as "the last layer" (l. 1002-1007, 556).
    `values(name) -> f32 [out, in] array` is called once per ratio-defining weight when
    ratio < 1 (the data-free sensitivity pass); `scores` ({name: score}, from `sensitivity`) may
    be given instead, e.g. computed while the weights were first streamed.
    `held` ({name: why}) names weights that int4 modes keep in the backup int8 whatever the ratio
    (as NNCF does for an ignored scope compressed to int8 on its own): they are not ratio-defining.
    """
    mode = _primary_mode(variant)
    weights = [(name, tuple(int(d) for d in shape)) for name, shape in weights]
    names = [name for name, _ in weights]
    if len(set(names)) != len(names):
        raise Gguf2ovError("plan_modes: weight names must be unique (NNCF compresses a shared weight once)")
    for name, shape in weights:
        if len(shape) not in (2, 3):
            raise Gguf2ovError(f"plan_modes: weight {name!r} has shape {shape}, expected [out, in] or "
                               "[experts, out, in]")

    if variant.bits == 8:
        # int8 is per channel for every weight; a ratio is ignored for int8 (as the whole-model export did,
        # NNCF itself would refuse one), all_layers=True makes NNCF refuse the call
        if variant.all_layers:
            raise Gguf2ovError(f"variant {variant.name!r}: NNCF's int8 modes take no all_layers option")
        return {name: WeightSpec(mode, -1, "primary") for name in names}  # embeddings too (l. 549-550)

    backup = WeightSpec(INT8_ASYM, -1, "backup: last MatMul")
    embeddings = set(embeddings)
    plan = {name: WeightSpec(INT8_ASYM, -1, "backup: embedding") if name in embeddings else backup for name in names}
    matmuls = [(name, shape) for name, shape in weights if name not in embeddings]
    ratio_defining = matmuls if variant.all_layers or last_shared else matmuls[:-1]
    held = held or {}
    for name in held:
        if name in plan:
            plan[name] = WeightSpec(INT8_ASYM, -1, f"backup: {held[name]}")
    ratio_defining = [(name, shape) for name, shape in ratio_defining if name not in held]
    if variant.all_layers:  # _get_ratio_defining_params appends the embeddings after the MatMuls
        ratio_defining += [(name, shape) for name, shape in weights if name in embeddings]
    groups = {name: variant.group_size for name, _ in ratio_defining}
    if variant.group_fallback == "adjust":  # before the ratio, as NNCF adjusts (algorithm.py l. 1081-1082)
        groups = {name: adjusted_group(variant.group_size, shape[-1]) for name, shape in ratio_defining}
        for name in [name for name, group in groups.items() if group is None]:
            plan[name] = WeightSpec(INT8_ASYM, -1, "backup: group size")
        ratio_defining = [(name, shape) for name, shape in ratio_defining if groups[name] is not None]
    ratio = variant.ratio if variant.ratio is not None else 1.0
    primary = list(ratio_defining)
    if ratio < 1 and ratio_defining:
        primary = _within_ratio(variant, ratio_defining, values, scores)
        for name, _ in ratio_defining:
            plan[name] = WeightSpec(INT8_ASYM, -1, "backup: ratio")
    _require_group_size(variant, primary)
    for name, _ in primary:
        plan[name] = WeightSpec(mode, groups[name], "primary")
    return plan


# the smallest group NNCF's ADJUST takes (AdvancedCompressionParameters.min_adjusted_group_size's default)
MIN_ADJUSTED_GROUP = 32


def adjusted_group(group_size: int, width: int) -> int | None:
    """NNCF's GroupSizeFallbackMode.ADJUST for a weight of input `width` (algorithm.py l. 721-770): the group
    where it divides the width, else the largest power of two that divides the width if at least
    MIN_ADJUSTED_GROUP, else None (the weight goes to the backup int8)."""
    if width % group_size == 0:
        return group_size
    power = width & -width
    return power if power >= MIN_ADJUSTED_GROUP else None


def _within_ratio(variant, ratio_defining: list, values, scores: dict | None) -> list:
    """The ratio-defining (name, shape)s that stay in int4 under `variant.ratio` < 1: the least sensitive
    first, while their share of the weights stays under the ratio (MixedPrecisionCriterion.apply,
    mixed_precision.py l. 85-100)."""
    if scores is None:
        if values is None:
            raise Gguf2ovError(
                f"variant {variant.name!r}: ratio < 1 ranks the weights by their values: pass values(name)"
            )
        scores = {name: sensitivity(values(name)) for name, _ in ratio_defining}
    total = sum(_num_weights(shape) for _, shape in ratio_defining)
    order = [i for i, _ in sorted(enumerate(scores[name] for name, _ in ratio_defining), key=lambda x: x[1])]
    primary, in_int4 = [], 0
    for i in order:
        name, shape = ratio_defining[i]
        if (in_int4 + _num_weights(shape)) / total >= variant.ratio:
            break
        primary.append(ratio_defining[i])
        in_int4 += _num_weights(shape)
    return primary


def _require_group_size(variant, primary: list) -> None:
    """Refuse a group size that does not divide the input width of every weight compressed in int4
    (validate_group_size, algorithm.py l. 654-679), unless the variant adjusts it (`adjusted_group`)."""
    if variant.group_fallback == "adjust":
        return
    bad = [(name, shape[-1]) for name, shape in primary if shape[-1] % variant.group_size]
    if bad:
        fits = [g for g in GROUP_SIZES if all(shape[-1] % g == 0 for _, shape in primary)]
        raise Gguf2ovError(
            f"group size {variant.group_size} does not divide the input width of {len(bad)} of the {len(primary)} "
            "weights it would compress in int4: " + ", ".join(f"{name} ({width})" for name, width in bad[:3])
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""),
            hint=f"group sizes that divide every input width: {', '.join(map(str, fits))}" if fits else
            "choose a group size that divides every input width",
        )


def _as_f32_2d(w) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise Gguf2ovError(f"expected a 2-D [out, in] weight, got shape {w.shape}")
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    return np.ascontiguousarray(w)


@contextlib.contextmanager
def _nncf_silenced():
    """NNCF prints a bit-width table and a progress bar per call: meaningless for one weight."""
    import nncf
    from nncf.common.logging.logger import nncf_logger

    level = nncf_logger.level
    nncf.set_log_level(logging.ERROR)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            yield
    finally:
        nncf.set_log_level(level)


def compress_weight(w, spec: WeightSpec, name: str = "weight", gather: bool = False):
    """The decompression subgraph's output (f32 [out, in]) of `w` compressed as NNCF would per `spec`.

    `w`: f32 [out, in], or [experts, out, in] for a batched MatMul; `name` becomes the compressed
    constant's friendly name (NNCF names the scale / zero point after it), as the weight's Constant
    name does in a whole-model run.
    `gather`: `w` is an embedding table, compressed as NNCF compresses the table of a Gather (one
    scale per row, or per group along the row; its subgraph named after input port 0).
    """
    import nncf
    import openvino as ov
    from openvino import opset13 as ops

    w = _as_f32_2d(w) if np.ndim(w) != 3 or gather else np.ascontiguousarray(w, dtype=np.float32)
    # ov.Tensor(array, shape, type) wraps the array without a copy, read-only arrays included
    const = ops.constant(ov.Tensor(w, w.shape, ov.Type.f32), name=name, shared_memory=True)
    if w.ndim == 3:  # experts: MatMul(x [E, T, K], W [E, N, K], transpose_b), as the MoE block has them
        x = ops.parameter([w.shape[0], 1, w.shape[2]], ov.Type.f32, name="x")
        consumer = ops.matmul(x, const, transpose_a=False, transpose_b=True)
        port = 1
    elif gather:
        x = ops.parameter([-1], ov.Type.i64, name="ids")
        consumer = ops.gather(const, ops.convert(x, "i32"), ops.constant(np.int64(0)))
        port = 0
    else:
        x = ops.parameter([1, w.shape[1]], ov.Type.f32, name="x")
        consumer = ops.matmul(x, const, transpose_a=False, transpose_b=True)
        port = 1
    micro = ov.Model([ops.result(consumer)], [x], "one_weight")
    del const
    kwargs = {"mode": spec.nncf_mode}
    if spec.bits == 4:
        kwargs.update(group_size=spec.group_size, ratio=1.0, all_layers=True)
    elif spec.group_size != -1:
        raise Gguf2ovError(f"{name}: int8 is per channel, got group size {spec.group_size}")
    # nncf.compress_weights is wrapped in a telemetry session; opening one per weight costs more than
    # compressing a small weight (a background sender competes with the next kernel compile), so the
    # undecorated function is called: the same code path, without the session.
    compress_weights = getattr(nncf.compress_weights, "__wrapped__", nncf.compress_weights)
    try:
        # a scale beyond float16 (or a NaN value) would warn as NNCF casts it: the caller checks the constants
        with _nncf_silenced(), np.errstate(all="ignore"):
            micro = compress_weights(micro, **kwargs)
    except Exception as e:  # NNCF's own exception types for bad group sizes and shapes
        raise Gguf2ovError(f"NNCF could not compress {name} as {spec.mode} g{spec.group_size}: {e}") from e
    out = consumer.input_value(port)
    if out.get_node().get_type_name() == "Constant":
        raise Gguf2ovError(f"NNCF left {name} uncompressed ({spec.mode} g{spec.group_size})")
    # Detach the subgraph from the micro model so that nothing else keeps it alive.
    consumer.input(port).replace_source_output(ops.constant(np.zeros((1,) * w.ndim, np.float32)).output(0))
    del micro, consumer, x
    return out


# --- a large weight compressed in row chunks, its constants made while the .bin is written ---------

# Rows of a weight compressed at once: ~64 MB of float32, so that an 8B target's 151936 x 4096
# embedding (2.5 GB in float32) never is in memory whole. Per-channel and per-group quantization
# treat every row on its own, so the chunks give the whole weight's codes and scales.
CHUNK_ELEMENTS = 1 << 24


# Rows NNCF compresses to give a streamed weight's subgraph its structure (types, names, the shapes
# but for the rows): the values come from the chunks compressed while the .bin is written. A whole
# first chunk would compress most weights twice (a 1.7B target's int4 export: 83 s, against 59 s
# with 8 rows, which make the structure calls nearly free; the same .bin).
PROBE_ROWS = 8


def row_chunks(rows: int, width: int, elements: int | None = None) -> list[tuple[int, int]]:
    """(start, stop) of balanced row chunks of ~`elements` values each. Each chunk starts on a multiple
    of 8 rows, so that a chunk of 4-bit codes or zero points (half a byte a value) starts on a byte."""
    elements = elements or CHUNK_ELEMENTS
    count = max(1, -(-rows * width // elements))
    size = -(-max(8, -(-rows // count)) // 8) * 8
    return [(r0, min(rows, r0 + size)) for r0 in range(0, rows, size)]


def streamed_compression(rows_of, shape, spec: WeightSpec, postpone, name: str = "weight", gather: bool = False,
                         elements: int | None = None, check=None, probe_rows_of=None):
    """`compress_weight` of a [rows, width] weight read as `rows_of(start, stop)`, as PostponedConstants.

    The subgraph is NNCF's for the first `PROBE_ROWS` rows, widened to all rows; `postpone(type, shape,
    make, name)` makes each of its Constants that hold rows (codes, scales, zero points) a
    PostponedConstant. When OpenVINO writes the first of them, the weight is compressed again chunk
    by chunk into full-size buffers, which the Constants then take one by one: the float32 weight
    is never whole in memory, and its compressed form only until it is written. `check(values, total)`
    sees each chunk of the float Constants (the scales) as it is made, `total` of them in the weight;
    `probe_rows_of` reads the rows that give the subgraph its structure (default: `rows_of`).
    """
    import openvino as ov

    rows, width = int(shape[0]), int(np.prod(shape[1:], dtype=np.int64))  # [E, N, K] experts: chunks of experts
    chunks = row_chunks(rows, width, elements)
    first = min(rows, PROBE_ROWS)
    out = compress_weight((probe_rows_of or rows_of)(0, first), spec, name, gather)
    constants = subgraph_constants(out)
    held = {i: (c.get_output_element_type(0), [rows, *list(c.get_output_shape(0))[1:]])
            for i, c in enumerate(constants) if _rows_of(c) == first}
    pending: dict = {}

    def fill():
        buffers = {i: ov.Tensor(kind, ov.Shape(dims)) for i, (kind, dims) in held.items()}
        floats = [i for i, (kind, _) in held.items() if kind.is_real()]
        float_total = sum(buffers[i].get_size() for i in floats)
        for r0, r1 in chunks:
            parts = subgraph_constants(compress_weight(rows_of(r0, r1), spec, name, gather))
            for i, buffer in buffers.items():
                kind, dims = held[i]
                if check is not None and i in floats:
                    check(parts[i].get_data(), float_total)
                data = _bytes(parts[i].get_tensor_view())
                start = r0 * int(np.prod(dims[1:], dtype=np.int64)) * kind.bitwidth // 8
                _bytes(buffer)[start:start + data.size] = data
        pending.update(buffers)

    def part(i):
        def make():
            if not pending:
                fill()
            return pending.pop(i)
        return make

    for i, (kind, dims) in held.items():
        node = constants[i]
        replacement = postpone(kind, dims, part(i), node.get_friendly_name())
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(replacement.output(0))
    if first != rows:
        _widen(out, first, rows)
    return out


def float_constants(output) -> list[np.ndarray]:
    """The data of the float Constants of a weight's subgraph (NNCF's scales)."""
    return [c.get_data() for c in subgraph_constants(output) if c.get_output_element_type(0).is_real()]


def subgraph_constants(output) -> list:
    """The Constants of a weight's subgraph, each once, in a fixed depth-first order."""
    return [node for node in _subgraph(output) if node.get_type_name() == "Constant"]


def _subgraph(output) -> list:
    """Every node of a constant subgraph, inputs before the nodes that read them (depth first)."""
    order, seen = [], set()

    def visit(node):
        if node.get_name() in seen:
            return
        seen.add(node.get_name())
        for value in node.input_values():
            visit(value.get_node())
        order.append(node)

    visit(output.get_node())
    return order


def _rows_of(constant) -> int | None:
    shape = list(constant.get_output_shape(0))
    return shape[0] if len(shape) >= 2 else None


def _bytes(tensor) -> np.ndarray:
    return np.asarray(tensor.data).reshape(-1).view(np.uint8)


def _widen(output, first: int, rows: int) -> None:
    """The first chunk's subgraph made the whole weight's: a Reshape whose target shape starts with
    the chunk's row count takes the weight's, and every node infers its shape again."""
    from openvino import opset13 as ops

    for node in _subgraph(output):
        if node.get_type_name() == "Reshape" and node.input_value(1).get_node().get_type_name() == "Constant":
            dims = np.array(node.input_value(1).get_node().get_data()).reshape(-1)
            if dims.size and dims[0] == first:
                node.input(1).replace_source_output(ops.constant(np.array([rows, *dims[1:]], dims.dtype)).output(0))
        node.validate_and_infer_types()


def nncf_weight_order(model) -> list[tuple[str, tuple]]:
    """(MatMul friendly name, weight shape) of the weights NNCF compresses, in NNCF's topological order.

    NNCF numbers nodes breadth-first from the Parameters (ties by friendly name) and compresses
    in the lexicographical topological order of those ids (openvino/graph/nncf_graph_builder.py
    l. 158-181, common/graph/graph.py l. 583-592); that is not always `get_ordered_ops()`.
    Ignored patterns (RoPE) and non-float weights are left out, as NNCF leaves them.
    """
    import nncf
    from nncf.openvino.graph.model_utils import remove_friendly_name_duplicates
    from nncf.openvino.graph.nncf_graph_builder import GraphConverter
    from nncf.quantization.algorithms.weight_compression.algorithm import (SUPPORTED_DATA_TYPES, WeightCompression,
                                                                           get_weight_compression_configuration)

    model = remove_friendly_name_duplicates(model)
    graph = GraphConverter.create_nncf_graph(model)
    algo = WeightCompression(**get_weight_compression_configuration(nncf.CompressWeightsMode.INT8_ASYM), subset_size=1)
    algo.set_backend_entity(model)
    ignored = algo.get_ignored_node_names(graph)
    backend = algo._backend_entity
    order, seen = [], set()
    for node in algo.get_nodes_to_compress(graph):
        if node.node_name in ignored or node.metatype not in backend.matmul_metatypes:
            continue
        for weight_name, port in backend.get_weight_names_and_port_ids(node, graph):
            if weight_name in seen or backend.get_weight_dtype(node, port, model, graph) not in SUPPORTED_DATA_TYPES:
                continue
            seen.add(weight_name)
            order.append((node.node_name, tuple(backend.get_weight_shape(node, port, graph))))
    return order


def nncf_rt_info(variant) -> dict[str, str]:
    """The rt_info entries ("nncf", "weight_compression", key) -> value a whole-model run writes."""
    import nncf
    from nncf.quantization.advanced_parameters import convert_to_dict_recursively
    from nncf.quantization.algorithms.weight_compression.algorithm import get_weight_compression_configuration

    mode = WeightSpec(_primary_mode(variant)).nncf_mode
    if variant.bits == 4:
        from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

        fallback = GroupSizeFallbackMode(variant.group_fallback)
        cfg = get_weight_compression_configuration(
            mode, ratio=variant.ratio if variant.ratio is not None else 1.0, group_size=variant.group_size,
            all_layers=variant.all_layers or None,
            advanced_parameters=AdvancedCompressionParameters(group_size_fallback_mode=fallback),
        )
    else:
        cfg = get_weight_compression_configuration(mode)
    params = {
        "mode": cfg["mode"].value,
        "group_size": cfg["group_size"],
        "ratio": cfg["ratio"],
        "all_layers": cfg["all_layers"],
        "ignored_scope": [],  # an empty IgnoredScope is dumped as [] (nncf/openvino/rt_info.py l. 51-57)
        "sensitivity_metric": cfg["sensitivity_metric"].value,
        "awq": cfg["awq"],
        "scale_estimation": cfg["scale_estimation"],
        "gptq": cfg["gptq"],
        "lora_correction": cfg["lora_correction"],
        "backup_mode": cfg["backup_mode"].value,
        "compression_format": nncf.CompressionFormat.DQ.value,
        "advanced_parameters": convert_to_dict_recursively(cfg["advanced_parameters"]),
    }
    return {key: str(value) for key, value in params.items()}


def write_nncf_rt_info(model, variant, ignored: list[str] = ()) -> None:
    """Record `variant`'s NNCF parameters in `model`'s rt_info as `nncf.compress_weights` does;
    `ignored`: the MatMuls left uncompressed (a router), as `IgnoredScope(names=...)` records them."""
    import nncf

    for key, value in nncf_rt_info(variant).items():
        if key == "ignored_scope" and ignored:
            model.set_rt_info(str(list(ignored)), ["nncf", "weight_compression", key, "names"])
        else:
            model.set_rt_info(value, ["nncf", "weight_compression", key])
    model.set_rt_info(nncf.__version__, ["nncf", "version"])


def decompression_signature(output, with_data: bool = False) -> list[tuple]:
    """(op type, element type, shape) of every node of a weight's constant subgraph, depth first.

    Names are left out. With `with_data`, each Constant also contributes a digest of its stored
    bytes (codes, scales, zero points), so that two compressions are equal iff signatures are.
    """
    import hashlib

    sig, stack = [], [output.get_node()]
    while stack:
        node = stack.pop()
        entry = (node.get_type_name(), node.get_output_element_type(0).get_type_name(),
                 tuple(node.get_output_partial_shape(0).to_shape()))
        if with_data and node.get_type_name() == "Constant":
            entry += (hashlib.sha256(np.asarray(node.data).tobytes()).hexdigest()[:16],)
        sig.append(entry)
        stack.extend(v.get_node() for v in reversed(node.input_values()))
    return sig
