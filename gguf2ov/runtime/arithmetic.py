"""The arithmetic a compiled model runs, read from compiled models, not inferred from properties.

The CPU plugin can quantize the activations of a MatMul with compressed weights to int8 on the fly
(dynamic quantization). Whether it does depends on the CPU, on the weight's form and on the
properties: measured with OpenVINO 2026.4.1, an AMD Zen 4 (AVX512-VNNI) takes that path for i8
weights and for u4/u8 codes without a zero point, not for codes with an f32 zero point nor for an
expert GatherMatmul; an AMD Zen 3 (AVX2 only) takes it for none, though both report
`DYNAMIC_QUANTIZATION_GROUP_SIZE` 32. The compiled model's own per-node information does not tell
either: a FullyConnected reads `brgemm_avx512_f32` on both paths.

So each distinct weight form of a model is compiled on its own, on one of its weights as stored: a
MatMul for a Linear's weight, and for the experts of a mixture-of-experts layer the whole block that
the plugin fuses into GatherMatmul. Each is compiled with the run's properties and again with dynamic
quantization off, and run on the same rows (one, and a verify pass's eight). Where the outputs move
beyond float rounding, the MatMul takes the int8 path. The inference precision, the KV cache
precision and the group size are read from the same compiled models (`get_property`).
"""

from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from ..numerics import DQ_KEY, KV_KEY, NO_RUNTIME_CACHE, model_runtime_options, plugin_default
from ..work import count

# Dynamic quantization moves a MatMul's output by 2e-3 to 1e-2 of its largest value (int8 activations
# per group of 32, measured on Q8_0, Q4_K and u4 weights of 256 to 4096 inputs); float32 paths differ
# by rounding, under 1e-6.
MOVED = 1e-4
ROWS = (1, 8)  # a decode step, and a verify pass of seven proposals


@dataclass(frozen=True)
class MatMulForm:
    """The MatMuls of a model that share one weight form, and the path the compiled model takes for them."""

    form: str            # "u4, f32 scale and zero point per 32"
    kernel: str          # "FullyConnected" | "GatherMatmul" (what the compiled probe ran)
    matmuls: int         # MatMuls of this form
    weights: int         # weight elements they hold
    int8: bool           # activations quantized to int8 on the fly
    moved: float         # the probe's relative change with dynamic quantization off

    @property
    def path(self) -> str:
        return "int8" if self.int8 else "float"


def _weight_nodes(output) -> list:
    """The nodes of a weight's constant subgraph (Constants, Converts, Subtract, Multiply, Reshape)."""
    seen, stack, nodes = set(), [output.get_node()], []
    while stack:
        node = stack.pop()
        if node.get_name() in seen:
            continue
        seen.add(node.get_name())
        if node.get_type_name() in ("Parameter", "ReadValue"):
            return []
        nodes.append(node)
        stack.extend(v.get_node() for v in node.input_values())
    return nodes


def _constant_type(node) -> str:
    """The element type a decompression input is stored in (through its Convert, if any)."""
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_output_element_type(0).get_type_name()


def _elements(node) -> int:
    return int(np.prod(node.get_output_shape(0))) if node.get_output_shape(0) else 1


def weight_form(output) -> str | None:
    """How a MatMul's weight is stored, in a few words ("u4, f32 scale and zero point per 32", "i8, f16 scale
    per row", "f32"), or None when it is not a constant subgraph."""
    nodes = _weight_nodes(output)
    if not nodes:
        return None
    codes = max((n for n in nodes if n.get_type_name() == "Constant"), key=_elements)
    form = codes.get_output_element_type(0).get_type_name()
    multiply = next((n for n in nodes if n.get_type_name() == "Multiply"), None)
    if multiply is None:
        return form
    # the scale: the Multiply's input that does not lead back to the codes
    scale = next(v for v in multiply.input_values()
                 if all(n.get_name() != codes.get_name() for n in _weight_nodes(v)))
    scale = _constant_type(scale.get_node())
    subtract = next((n for n in nodes if n.get_type_name() == "Subtract"), None)
    zero = _constant_type(subtract.input_value(1).get_node()) if subtract is not None else None
    stored = (f"{scale} scale and zero point" if zero == scale else
              f"{scale} scale, {zero} zero point" if zero else f"{scale} scale")
    rank = output.get_partial_shape().rank.get_length()
    group = codes.get_output_shape(0)[-1] if len(codes.get_output_shape(0)) == rank + 1 else None
    return f"{form}, {stored} per {group}" if group else f"{form}, {stored} per row"


def _expert_block(model, matmul):
    """The mixture-of-experts block around an expert MatMul ([E, N, K] weight), as the plugin fuses it:
    from the hidden states [B, L, H] whose tokens the block tiles over its experts, to the ReduceSum over
    the experts. The block is cut out of `model` (a copy read for this), its input made a Parameter."""
    from openvino import opset13 as ops

    entry = matmul.input_value(0)
    while entry.get_node().get_type_name() != "Tile":
        entry = entry.get_node().input_value(0)
    tokens = entry.get_node().input_value(0)  # [T, H]: the block's input flattened, and normed there in Gemma 4
    entry = tokens
    while entry.get_partial_shape().rank.get_length() != 3:  # up the input's own path to the [B, L, H] states
        entry = next(v for v in entry.get_node().input_values() if not _weight_nodes(v))
    exit_, frontier = None, [matmul]
    while exit_ is None:
        node = frontier.pop(0)
        for consumer in (t.get_node() for out in node.outputs() for t in out.get_target_inputs()):
            if consumer.get_type_name() == "ReduceSum":
                exit_ = consumer
            frontier.append(consumer)
    width = tokens.get_partial_shape()[1].get_length()
    hidden = ops.parameter([1, -1, width], np.float32, name="hidden")
    entry.replace(hidden.output(0))
    return hidden, exit_.output(0)


def _input_width(matmul) -> int:
    """The width a MatMul's input rows have: the weight's reduced dimension (the input's own last one can be
    dynamic, as in a traced draft's convolutions)."""
    shape = matmul.input_value(1).get_shape()
    return int(shape[-1] if matmul.get_transpose_b() or len(shape) == 1 else shape[-2])


def _probe(model, matmul, expert: bool):
    """A model of one weight form: its MatMul alone (x [M, K] @ the weight as stored), or for an expert
    weight its whole block. Returns (model, input width)."""
    import openvino as ov
    from openvino import opset13 as ops

    from ..ir.irweights import copy_weight

    if expert:
        hidden, out = _expert_block(model, matmul)
        return ov.Model([ops.result(out)], [hidden], "expert_block"), hidden.get_partial_shape()[2].get_length()
    width = _input_width(matmul)
    x = ops.parameter([-1, width], np.float32, name="x")
    y = ops.matmul(x, copy_weight(matmul.input_value(1)), matmul.get_transpose_a(), matmul.get_transpose_b())
    return ov.Model([ops.result(y)], [x], "matmul"), width


def _run(compiled, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    rank = compiled.input(0).get_partial_shape().rank.get_length()
    return [compiled(rng.standard_normal((1,) * (rank - 2) + (m, width)).astype(np.float32))[0] for m in ROWS]


def _moved(a: list, b: list) -> float:
    return max(float(np.abs(x - y).max() / max(float(np.abs(y).max()), 1e-30)) for x, y in zip(a, b))


def _kernel(compiled, expert: bool) -> str:
    layers = {op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()}
    if expert:
        return "GatherMatmul" if "GatherMatmul" in layers else "MatMul (dense experts)"
    return "FullyConnected" if "FullyConnected" in layers else "MatMul"


def _weight_matmuls(model):
    """(MatMul, weight elements, expert) for each MatMul of `model` whose weight is a constant subgraph."""
    out = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        weight = op.input_value(1)
        if not _weight_nodes(weight):
            continue
        shape = weight.get_partial_shape()
        if shape.is_dynamic:
            continue
        out.append((op, int(np.prod([d.get_length() for d in shape])), shape.rank.get_length() == 3))
    return out


def matmul_forms(xml, device: str, properties: dict) -> tuple[list[MatMulForm], dict]:
    """Each weight form of the IR at `xml`, with the path its MatMuls take when compiled for `device` with
    `properties` (and the IR's own `runtime_options`), and what the compiled models say of the run: the
    inference precision, the KV cache precision and the dynamic quantization group size."""
    read = lambda: _core().read_model(str(xml))  # noqa: E731  a fresh copy per expert block cut out of it
    model = read()
    groups: dict[tuple, list] = {}
    for op, size, expert in _weight_matmuls(model):
        form = weight_form(op.input_value(1))
        key = (form, expert, _input_width(op))
        groups.setdefault(key, []).append((op, size))
    runtime_options, options = model_runtime_options(xml), dict(properties)
    cpu = device.split(".")[0].upper() == "CPU"
    forms, read_back = [], {}
    for (form, expert, _), members in groups.items():
        op, _ = min(members, key=lambda m: m[1])  # the smallest weight of the form: the cheapest compile
        copy = read() if expert else model  # an expert block is cut out of a copy of its own
        probe_model, width = _probe(copy, _find(copy, op) if expert else op, expert)
        count("arithmetic probes")
        as_run = _compile(probe_model, device, options, runtime_options)
        read_back = read_back or _read_properties(as_run, cpu)
        moved = 0.0
        if cpu and read_back["dynamic_quantization_group_size"]:  # a compiled model with the group at 0 quantizes none
            without = _compile(probe_model, device, {**options, DQ_KEY: 0}, runtime_options)
            moved = _moved(_run(as_run, width), _run(without, width))
        forms.append(MatMulForm(form=form, kernel=_kernel(as_run, expert), matmuls=len(members),
                                weights=sum(s for _, s in members), int8=moved > MOVED, moved=moved))
    if not read_back:
        read_back = _read_properties(_compile(_nothing(), device, options, runtime_options), cpu)
    return _merged(forms), read_back


def _merged(forms: list[MatMulForm]) -> list[MatMulForm]:
    """One entry per form, kernel and path (a form is measured once per input width), largest first."""
    merged: dict[tuple, MatMulForm] = {}
    for f in forms:
        key = (f.form, f.kernel, f.int8)
        if key in merged:
            m = merged[key]
            f = MatMulForm(f.form, f.kernel, m.matmuls + f.matmuls, m.weights + f.weights, f.int8, max(m.moved, f.moved))
        merged[key] = f
    return sorted(merged.values(), key=lambda f: (-f.weights, f.form))


def _find(model, op):
    """The node of `model` (another copy of the same IR) that `op` is."""
    name = op.get_friendly_name()
    return next(n for n in model.get_ordered_ops() if n.get_friendly_name() == name)


def _nothing():
    """A model with nothing to measure, compiled for the properties in force on a model without weights."""
    import openvino as ov
    from openvino import opset13 as ops

    x = ops.parameter([1, 4], np.float32, name="x")
    return ov.Model([ops.result(ops.relu(x))], [x], "nothing")


def _compile(model, device: str, properties: dict, runtime_options: dict):
    """`model` compiled as the IR it stands for would be: with `properties`, and the IR's own `runtime_options`
    in its rt_info, which OpenVINO applies as far as the plugin knows them (the same keys passed as
    properties would be refused)."""
    for key, value in runtime_options.items():
        model.set_rt_info(str(value), ["runtime_options", key])
    cpu = device.split(".")[0].upper() == "CPU"
    return _core().compile_model(model, device, {**properties, **(NO_RUNTIME_CACHE if cpu else {})})


@cache
def _core():
    """A Core of the probes' own, with no property set on it: a property a process sets on its Core (as a
    test does) would override an IR's runtime_options, which a pipeline's Core leaves in force."""
    import openvino as ov

    return ov.Core()


def _read_properties(compiled, cpu: bool) -> dict:
    """What a compiled model says it runs with (the CPU plugin's keys on the CPU only)."""

    def read(key):
        try:
            value = compiled.get_property(key)
        except Exception:  # a device without the key
            return None
        return value.get_type_name() if hasattr(value, "get_type_name") else value

    props = {"inference_precision": read("INFERENCE_PRECISION_HINT")}
    if cpu:
        props.update(kv_cache_precision=read(KV_KEY), dynamic_quantization_group_size=read(DQ_KEY))
    return {k: (str(v) if k != "dynamic_quantization_group_size" or v is None else int(v)) for k, v in props.items()}


@lru_cache(maxsize=16)
def _measured(xml: str, stamp: float, device: str, properties: tuple) -> tuple:
    return matmul_forms(xml, device, dict(properties))


def measured_numerics(models: dict, device: str, properties: dict) -> dict:
    """The numerics a run's figures were measured under, read from compiled models (`numerics.describe_numerics`
    words them): the device and its name, the inference precision, the KV cache precision and the dynamic
    quantization group size in force, and per model (`models`: {"target": xml, "draft": xml}) each weight
    form's MatMuls and whether they take the int8 path. Measured once per IR file and settings."""
    info = {"device": device, "device_name": plugin_default(device)["device_name"], "models": {}}
    for role, xml in models.items():
        xml = Path(xml)
        forms, read_back = _measured(str(xml), xml.stat().st_mtime, device, tuple(sorted(properties.items())))
        info.update({k: v for k, v in read_back.items() if info.get(k) is None})
        info["models"][role] = [asdict(f) | {"path": f.path} for f in forms]
    every = [f for forms in info["models"].values() for f in forms]
    info["matmuls"] = sum(f["matmuls"] for f in every)
    info["int8_matmuls"] = sum(f["matmuls"] for f in every if f["int8"])
    return info
