"""Whole-model NNCF and a bit-for-bit comparison of two compressed models, for the tests that prove
per-weight compression (tests/ir/test_nncf_weights.py) and the streamed export (tests/draft) equal it."""

import numpy as np

from gguf2ov.ir import nncf_weights as nw
from gguf2ov.ir.irweights import matmul_weights
from gguf2ov.ir.variants import parse_variant


def nncf_compress(model, variant):
    """Whole-model NNCF, called with the arguments the export used before it streamed weights."""
    import nncf

    kwargs = {"mode": nw.WeightSpec(f"{variant.weight_format}_{'sym' if variant.sym else 'asym'}").nncf_mode}
    if variant.weight_format == "int4":
        kwargs.update(group_size=variant.group_size, ratio=variant.ratio if variant.ratio is not None else 1.0)
    if variant.all_layers:
        kwargs["all_layers"] = True
    return nncf.compress_weights(model, **kwargs)


def signatures(model) -> dict:
    return {name: nw.decompression_signature(mm.input_value(1), with_data=True) for name, mm in _linears_any(model).items()}


def _linears_any(model) -> dict:
    """{name: MatMul} for every MatMul whose weight input is a constant subgraph (compressed or not)."""
    return {op.get_friendly_name(): op for op in model.get_ordered_ops()
            if op.get_type_name() == "MatMul" and op.get_attributes()["transpose_b"]
            and op.get_friendly_name().endswith("aten::linear/MatMul")}


def stored_mode(signature) -> str:
    """int8_asym / int4_sym / ... from the stored codes' element type and the group reshape."""
    codes = next(entry for entry in signature if entry[0] == "Constant")[1]
    grouped = any(entry[0] == "Reshape" for entry in signature)
    return {"u8": "int8_asym", "i8": "int8_sym", "u4": "int4_asym", "i4": "int4_sym", "f32": "f32"}[codes] + (
        "/grouped" if grouped else "")


def differences(a, b, variant_name) -> list[str]:
    """Everything that differs between two compressed models; [] when bit for bit equal."""
    wa, wb = matmul_weights(a), matmul_weights(b)
    out = [] if wa and _linears_any(a) else ["no Linear weights found: nothing was compared"]
    if wa.keys() != wb.keys():
        out.append(f"weights {sorted(set(wa) ^ set(wb))}")
    for k in sorted(set(wa) & set(wb)):
        if not np.array_equal(wa[k], wb[k]):
            out.append(f"{k}: values differ by up to {np.max(np.abs(wa[k] - wb[k])):g}")
    sa, sb = signatures(a), signatures(b)
    for k in sorted(set(sa) | set(sb)):
        if sa.get(k) != sb.get(k):
            out.append(f"{k}: constants / subgraph differ")
    keys = nw.nncf_rt_info(parse_variant(variant_name))
    ra = {k: str(a.get_rt_info(["nncf", "weight_compression", k])) for k in keys}
    rb = {k: str(b.get_rt_info(["nncf", "weight_compression", k])) for k in keys}
    if ra != rb:
        out.append(f"rt_info {ra} != {rb}")
    return out
