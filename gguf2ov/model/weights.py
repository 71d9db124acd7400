"""How each weight of an IR variant is made, one at a time, as the graph asks for it.

The variant's format (`variants.FORMATS`) says how: a postponed fp32/fp16 constant, NNCF's
compression of the one weight, or the GGUF's own codes. The source is anything that hands out
tensors by name: `expected` (name -> PyTorch shape, in the graph's order), `f32(name)`,
`quantized(name)` (the stored GGUF blocks, or None) and `kind` ("gguf" or "checkpoint"); a draft's
`DraftSource` is one.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import Gguf2ovError
from .variants import Variant, require_source_for


@dataclass
class WeightForms:
    """The form each weight of one variant takes in the IR, made when the graph asks for it.

    fp32/fp16 weights are PostponedConstants: OpenVINO asks for their values only while it writes
    the .bin, one tensor at a time, so exporting holds no copy of the model (1 GB written with a
    200 MB peak, measured). `gguf` carries the file's codes (gguf/transcode.py); int8/int4 compress
    each weight with NNCF as the whole-model pass would (nncf_weights.py). `observe(name, output,
    values)` is called for every weight made, so `drift` can measure it while it streams; `values` is
    the source's float32 tensor when making the weight already read it (NNCF), else None.
    """

    source: object
    variant: Variant
    observe: Callable[[str, object, np.ndarray], None] | None = None
    transcoded: list = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    failure: BaseException | None = None  # what stopped a postponed weight while OpenVINO was saving

    def __post_init__(self):
        require_source_for(self.variant, self.source.kind)
        if self.variant.nncf:
            from .nncf_weights import plan_modes

            try:
                self.plan = plan_modes(self.variant, self.linear_weights(), values=self.source.f32)
            except Gguf2ovError as e:
                raise Gguf2ovError(f"NNCF cannot compress the draft as {self.variant.name}: {e.message}",
                                   hint=e.hint) from e

    def linear_weights(self) -> list[tuple[str, tuple]]:
        """Every Linear weight in the graph's order (the order NNCF walks the model in)."""
        return [(n, s) for n, s in self.source.expected.items() if len(s) == 2]

    def weight(self, name: str):
        output, values = self.variant.format.make(self, name)
        if self.observe is not None:
            self.observe(name, output, values)
        return output

    def vector(self, name: str) -> np.ndarray:
        return self.source.f32(name)

    def postponed(self, name: str, dtype: str):
        """A constant whose values OpenVINO asks for while it writes the .bin ("f32" or "f16")."""
        import openvino as ov
        from openvino import opset13 as ops
        from openvino.utils import make_postponed_constant

        source, shape = self.source, self.source.expected[name]

        def values():
            try:
                x = source.f32(name)
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


def ir_size(path) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(path).glob("openvino_model.*"))
