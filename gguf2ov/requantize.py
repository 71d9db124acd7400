"""Weight variants of a draft IR: fp32, fp16, NNCF int8/int4, and the GGUF grid transcode.

A variant is named the way it is built: `fp32`, `fp16`, `int8` / `int8_sym` (per channel),
`int4_asym_g16`, `int4_sym_g128`, ... (NNCF, with `_r0.8` for a ratio and `_all` for all layers),
and `gguf`, which rebuilds every weight from the codes, scales and minimums the GGUF file held
(see transcode.py) instead of letting NNCF choose new ones.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import Gguf2ovError
from .source import DraftSource
from .variants import Variant

# --- one weight at a time ----------------------------------------------------------------------------


@dataclass
class WeightForms:
    """The form each weight of one variant takes in the IR, made when the graph asks for it.

    fp32/fp16 weights are PostponedConstants: OpenVINO asks for their values only while it writes
    the .bin, one tensor at a time, so exporting holds no copy of the draft (1 GB written with a
    200 MB peak, measured). `gguf` carries the file's codes (transcode.py); int8/int4 compress each
    weight with NNCF as the whole-model pass would (nncf_weights.py). `observe(name, output, values)`
    is called for every weight made, so `drift` can measure it while it streams; `values` is the
    source's float32 tensor when making the weight already read it (NNCF), else None.
    """

    draft: DraftSource
    variant: Variant
    observe: Callable[[str, object, np.ndarray], None] | None = None
    transcoded: list = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    failure: BaseException | None = None  # what stopped a postponed weight while OpenVINO was saving

    def __post_init__(self):
        if self.variant.weight_format == "gguf" and self.draft.kind != "gguf":
            raise Gguf2ovError("the gguf variant carries the GGUF's own quantization grid: the source must be a GGUF file")
        if self.variant.nncf:
            from .nncf_weights import plan_modes

            try:
                self.plan = plan_modes(self.variant, self.linear_weights(), values=self.draft.f32)
            except Gguf2ovError as e:
                raise Gguf2ovError(f"NNCF cannot compress the draft as {self.variant.name}: {e.message}",
                                   hint=e.hint) from e

    def linear_weights(self) -> list[tuple[str, tuple]]:
        """Every Linear weight in the graph's order (the order NNCF walks the model in)."""
        return [(n, s) for n, s in self.draft.expected.items() if len(s) == 2]

    def weight(self, name: str):
        output, values = self._make(name)
        if self.observe is not None:
            self.observe(name, output, values)
        return output

    def vector(self, name: str) -> np.ndarray:
        return self.draft.f32(name)

    def _make(self, name: str):
        """(the weight's output in the graph, the source values read to make it or None)."""
        kind = self.variant.weight_format
        if kind == "gguf":
            from .transcode import grid_weight, has_grid

            stored = self.draft.quantized(name)
            if stored is not None and has_grid(stored[1]):
                self.transcoded.append(name)
                return grid_weight(stored[0], stored[1], self.draft.expected[name]), None
            return self._postponed(name, "f32"), None  # a float tensor in the file: its values, exactly
        if self.variant.nncf:
            from .nncf_weights import compress_weight

            values = self.draft.f32(name)
            return compress_weight(values, self.plan[name], name=name), values
        return self._postponed(name, "f16" if kind == "fp16" else "f32"), None

    def _postponed(self, name: str, dtype: str):
        import openvino as ov
        from openvino import opset13 as ops
        from openvino.utils import make_postponed_constant

        draft, shape = self.draft, self.draft.expected[name]

        def values():
            try:
                x = draft.f32(name)
                return ov.Tensor(np.ascontiguousarray(x.astype(np.float16) if dtype == "f16" else x))
            except BaseException as e:  # OpenVINO's serializer would turn it into its own exception
                self.failure = e
                raise

        const = make_postponed_constant(ov.Type.f16 if dtype == "f16" else ov.Type.f32, ov.Shape(list(shape)), values,
                                        name=f"self.{name}")
        if dtype == "f32":
            return const.output(0)
        # marked as decompression when saved (mark_decompression), so the CPU plugin keeps it f16
        return ops.convert(const.output(0), "f32").output(0)


_F16_CONVERT = re.compile(r'(<layer id="\d+" name="[^"]*" type="Convert" version="opset1">\s*<data destination_type="f32" />)'
                          r'(\s*<input>\s*<port id="0" precision="FP16">)')


def mark_decompression(xml_path) -> None:
    """Mark the f16 -> f32 weight Converts of a saved IR as decompression, as `compress_to_fp16` does.

    OpenVINO's Python API cannot set that attribute, and without it the CPU plugin folds every
    f16 weight into f32 at compile time: the fp16 draft would take the fp32 draft's memory.
    """
    from pathlib import Path

    path = Path(xml_path)
    text = path.read_text(encoding="utf-8")
    marked = _F16_CONVERT.sub(r'\1\n\t\t\t<rt_info>\n\t\t\t\t<attribute name="decompression" version="0" />'
                              r'\n\t\t\t</rt_info>\2', text)
    if marked != text:
        path.write_text(marked, encoding="utf-8")


def ir_size(path) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(path).glob("openvino_model.*"))
