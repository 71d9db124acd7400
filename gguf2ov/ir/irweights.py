"""Reading the weights of an OpenVINO IR back as float32, whatever compression they carry.

Every MatMul whose weight input is a constant subgraph (a plain Constant, or NNCF's
Convert -> Subtract -> Multiply -> Reshape decompression) is evaluated on its own, so an int4 IR
yields the values the runtime actually multiplies with. Keys are the PyTorch parameter names
(`layers.0.mlp.gate_proj.weight`), recovered from the exporter's node names.
"""

import re
from pathlib import Path

import numpy as np

from ..names import IR_XML
from ..numerics import compile_exact
from ..work import count

# optimum's PyTorch frontend names a Linear's MatMul "__module.<path>/aten::linear/MatMul" and an
# Embedding's lookup "__module.<path>/aten::embedding/Gather"
_MODULE_PATH = re.compile(r"__module\.(?P<path>[^/]+)/aten::(?:linear/MatMul|embedding/Gather)")
_WEIGHT_INPUT = {"MatMul": 1, "Gather": 0}


def read_model(model_or_path):
    import openvino as ov

    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if path.is_dir():
            path = path / IR_XML
        return ov.Core().read_model(str(path))
    return model_or_path


def _is_constant_subgraph(output) -> bool:
    seen, stack = set(), [output.get_node()]
    while stack:
        node = stack.pop()
        if node.get_name() in seen:  # unique; the id() of a node's Python wrapper is reused
            continue
        seen.add(node.get_name())
        kind = node.get_type_name()
        if kind in ("Parameter", "ReadValue"):
            return False
        stack.extend(v.get_node() for v in node.input_values())
    return True


def weight_param_name(matmul) -> str | None:
    m = _MODULE_PATH.fullmatch(matmul.get_friendly_name())
    return f"{m['path']}.weight" if m else None


def evaluate(output) -> np.ndarray:
    """The float32 value of one constant subgraph (a weight as the runtime multiplies with it).

    OpenVINO's own constant folding computes it: 1.6x faster than compiling the subgraph for the
    CPU (1.7 s against 2.75 s for an int4 4096 x 12288 weight, measured), with the same values.
    """
    import openvino as ov
    from openvino.passes import ConstantFolding, Manager

    # a copy: folding rewires the consumers of what it folds, and the graph being built is one of them
    sub = ov.Model([ov.opset13.result(ov.opset13.convert(output, "f32"))], [], "weight").clone()
    manager = Manager()
    manager.register_pass(ConstantFolding())
    manager.run_passes(sub)
    folded = sub.get_results()[0].input_value(0).get_node()
    if folded.get_type_name() != "Constant":
        raise ValueError(f"the weight subgraph did not fold to a constant ({folded.get_type_name()})")
    return np.array(folded.get_data(), dtype=np.float32)


def copy_weight(output):
    """A copy of the constant subgraph behind `output` (a weight through its decompression) whose
    Constants share the stored bytes (a memory-mapped IR's stay mapped): a model that holds it
    writes the weight as stored when it is saved, and nothing is copied before. OpenVINO's clone
    makes the new nodes; its Constants share the original's data."""
    import openvino as ov

    return ov.Model([ov.opset13.result(output)], [], "weight").clone().get_results()[0].input_value(0)


# Rows per head sub-model call: bounds the [rows, vocab] float32 logits (152k-token vocabulary:
# 64 rows are 39 MB).
HEAD_ROWS = 64


def gather_rows(weight):
    """rows(ids) -> [len(ids), ...] float32 rows of a constant weight subgraph (an embedding table, a
    head's [vocab, hidden] weight) through its decompression as stored, read only where asked:
    Gather(the weight, ids), compiled once (an int4 table stays int4)."""
    import openvino as ov
    from openvino import opset13 as ops

    ids = ops.parameter([-1], np.int64, name="ids")
    rows = ops.convert(ops.gather(weight, ids, ops.constant(np.int64(0))), "f32")
    count("target sub-model compiles")
    # exact: the draft's inputs and the copies of the target's weights it holds, as on every CPU
    request = compile_exact(ov.Model([ops.result(rows)], [ids], "weight_rows")).create_infer_request()
    return lambda ids: request.infer({0: np.asarray(ids, dtype=np.int64)})[0].astype(np.float32, copy=False)


def matmul_rows(matmul):
    """logits(rows [n, H]) -> [n, vocab] float32: a head's MatMul alone, on its weight as stored,
    compiled once and run `HEAD_ROWS` rows at a time."""
    import openvino as ov
    from openvino import opset13 as ops

    weight = matmul.input_value(1)
    hidden_shape = matmul.input_value(0).get_partial_shape()
    hidden = hidden_shape[hidden_shape.rank.get_length() - 1].get_length()
    out_shape = matmul.get_output_partial_shape(0)
    vocab = out_shape[out_shape.rank.get_length() - 1].get_length()
    rows = ops.parameter([-1, hidden], np.float32, name="rows")
    logits = ops.matmul(rows, weight, matmul.get_transpose_a(), matmul.get_transpose_b())
    count("target sub-model compiles")
    # exact: drift and the tap scan compare these logits across variants and machines
    request = compile_exact(ov.Model([ops.result(logits)], [rows], "head")).create_infer_request()

    def run(x):
        x = np.asarray(x, dtype=np.float32).reshape(-1, hidden)
        parts = [request.infer({0: x[i:i + HEAD_ROWS]})[0].copy() for i in range(0, len(x), HEAD_ROWS)]
        return np.concatenate(parts) if parts else np.zeros((0, vocab), np.float32)

    return run


def matmul_weights(model_or_path) -> dict[str, np.ndarray]:
    """{parameter name: float32 [out, in] array} for every Linear of the IR."""
    return ir_weights(model_or_path, kinds=("MatMul",))


def ir_weights(model_or_path, kinds=("MatMul", "Gather")) -> dict[str, np.ndarray]:
    """{parameter name: float32 array} for every Linear (MatMul) and Embedding (Gather) of the IR; a
    Linear whose offset is split off (gguf.transcode.SplitWeight) with its offset added back."""
    import openvino as ov

    model = read_model(model_or_path)
    names, outputs = [], []
    for op in model.get_ordered_ops():
        if op.get_type_name() not in kinds:
            continue
        name = weight_param_name(op)
        weight = op.input_value(_WEIGHT_INPUT[op.get_type_name()])
        if name is None or name in names or not _is_constant_subgraph(weight):
            continue
        names.append(name)
        outputs.append(_with_offset(op, weight))
    if not outputs:
        return {}
    # A parameterless model of just the weight subgraphs; OpenVINO folds and evaluates it.
    sub = ov.Model([ov.opset13.convert(o, "f32").output(0) for o in outputs], [], "weights")
    compiled = compile_exact(sub)  # the weights' own values, whatever the CPU
    result = compiled.create_infer_request().infer({})
    return {name: np.asarray(result[compiled.output(i)], dtype=np.float32) for i, name in enumerate(names)}


def _with_offset(matmul, weight):
    """The weight a Linear multiplies by: `weight`, plus the offset a split weight's second MatMul (on the
    group sums of the same input, gguf.transcode.SplitWeight) adds to its output, repeated over each group."""
    from openvino import opset13 as ops

    if matmul.get_type_name() != "MatMul":
        return weight
    for target in matmul.output(0).get_target_inputs():
        add = target.get_node()
        if add.get_type_name() != "Add" or target.get_index() != 0:
            continue
        second = add.input_value(1).get_node()
        if second.get_type_name() != "MatMul" or not _is_constant_subgraph(second.input_value(1)):
            continue
        sums = second.input_value(0).get_node()
        if sums.get_type_name() != "ReduceSum" or sums.input_value(0).get_node().input_value(0) != matmul.input_value(0):
            continue
        offset = second.input_value(1)
        rows, groups = (d.get_length() for d in offset.get_partial_shape())
        columns = weight.get_partial_shape()[1].get_length()
        spread = ops.broadcast(ops.unsqueeze(offset, ops.constant(np.int64(-1))),
                               ops.constant(np.array([rows, groups, columns // groups], np.int64)))
        return ops.add(weight, ops.reshape(spread, ops.constant(np.array([rows, columns], np.int64)), False)).output(0)
    return weight


# --- what the IR's weights are stored as ------------------------------------------------------------


def weight_constants(model) -> dict:
    """{MatMul name: the stored constant behind it} for each MatMul that multiplies by a weight
    (through its decompression)."""
    found = {}
    for op in model.get_ops():
        if op.get_type_name() == "MatMul":
            src = op.input_value(1).get_node()
            while src.get_type_name() in ("Convert", "Multiply", "Subtract", "Reshape") and src.get_input_size():
                src = src.input_value(0).get_node()
            if src.get_type_name() == "Constant":
                found[op.get_friendly_name()] = src
    return found


def weight_matmuls(model) -> int:
    """How many MatMuls multiply by a weight: an operand computed from constants alone, whatever
    decompression (NNCF's, the GGUF grid's) makes it."""
    constant: dict = {}

    def from_constants(node) -> bool:
        key = node.get_friendly_name()
        if key not in constant:
            kind = node.get_type_name()
            constant[key] = kind == "Constant" or (kind not in ("Parameter", "ReadValue") and node.get_input_size() > 0
                                                   and all(from_constants(i.get_node()) for i in node.input_values()))
        return constant[key]

    return sum(op.get_type_name() == "MatMul" and from_constants(op.input_value(1).get_node()) for op in model.get_ops())


def constant_values(node, max_rows: int | None = None):
    """The value of a weight constant, through the Convert that fp16 compression inserts.

    `max_rows` reads evenly spaced rows only: the data is memory-mapped, and reading a whole 1 B
    draft's weights would bring all of it into memory for a standard deviation.
    """
    if node.get_type_name() == "Convert" and node.input_value(0).get_node().get_type_name() == "Constant":
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant" or not node.get_output_element_type(0).is_real():
        return None
    data = node.get_data()
    if max_rows is not None and data.ndim == 2 and len(data) > max_rows:
        data = data[:: -(-len(data) // max_rows)]
    return data.astype("float32")
