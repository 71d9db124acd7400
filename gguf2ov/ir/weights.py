"""How each weight of an IR variant (a draft's or a target's) is made, one at a time, as the graph
asks for it.

The variant's format (`variants.FORMATS`) says how: a postponed fp32/fp16 constant, NNCF's
compression of the one weight, or the GGUF's own codes. The source is a `WeightSource`: an opened
draft (`draft.source.DraftSource`) or target (`target.source.TargetSource`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import Gguf2ovError
from .postponed import DecodeAhead, PostponedConstants
from .spill import Spill
from .variants import Variant, require_source_for

# How `gguf` weights carry the file's grid (WeightForms.grid; gguf/transcode.py).
GRIDS = ("split", "folded", "compact")


class WeightSource(Protocol):
    """What the weights of a graph are read from: an opened draft (draft.source.DraftSource) or target
    (target.source.TargetSource)."""

    kind: str                             # "gguf" | "checkpoint"
    expected: dict[str, tuple[int, ...]]  # every tensor the graph reads, in the graph's order
    embeddings: tuple[str, ...]           # the tables an embedding Gather reads (a draft has none)
    last_matmul_shared: bool              # the last MatMul re-uses an earlier weight (a tied lm_head)
    int8_weights: dict[str, str]          # weights int4 keeps in int8, with why (a target's layer kinds)
    kept: tuple[str, ...]                 # weights every format keeps in float32 (a router)
    batched: tuple[str, ...]              # [E, N, K] batched-MatMul weights (experts)

    def f32(self, name: str) -> np.ndarray: ...

    def f32_rows(self, name: str, start: int, stop: int) -> np.ndarray: ...

    def quantized(self, name: str): ...


@dataclass
class WeightForms:
    """The form each weight of one variant takes in the IR, made when the graph asks for it.

    fp32/fp16 weights are PostponedConstants: OpenVINO asks for their values only while it writes
    the .bin, one tensor at a time, so exporting holds no copy of the model (1 GB written with a
    200 MB peak, measured). `gguf` carries the file's codes (gguf/transcode.py); int8/int4 compress
    each weight with NNCF as the whole-model pass would (nncf_weights.py). An embedding table (a
    target's) takes the form the CPU plugin keeps compressed under a Gather.

    `streamed` (a target's export): the grid and NNCF weights are PostponedConstants too, made
    while the .bin is written, NNCF's in row chunks, so that exporting holds one weight at a time
    whatever the variant (an 8B target's int4 form alone is ~5 GB). Without it (a draft's export)
    they are built in memory, where `observe(name, output, values)` sees each weight as it is made,
    so `drift` can measure it while it streams; `values` is the source's float32 tensor when making
    the weight already read it (NNCF), else None.

    `grid` (GRIDS), how `gguf` weights carry the file's grid (gguf/transcode.py): "compact", the file's
    own factorisation, 1.00x its tensor bytes (a draft's); "folded", the form the CPU plugin runs from
    without private copies (scales multiplied out, 5/6-bit codes as u8: "Run-time memory"), a target's
    default; "split", folded with a K-quant's minimum apart, which takes the plugin's int8 path ("Which
    forms run fast"). An embedding table is folded in every grid, and so is a weight in `whole` (the
    lm_head: GenAI grafts its MatMul's weight onto the draft, which a split weight's two MatMuls are not).

    Every value the IR stores is checked where it is made, chunk by chunk (`check_finite`): the
    source's float32 values, the float16 constants made of them, NNCF's float16 scales, and the
    grid's scales and zero points. A NaN or Inf stops the build naming the tensor, unless
    `allow_nonfinite`: then it is counted in `nonfinite` (weight -> values).
    """

    source: WeightSource
    variant: Variant
    observe: Callable[[str, object, np.ndarray], None] | None = None
    streamed: bool = False
    grid: str = "compact"
    whole: tuple[str, ...] = ()
    transcoded: list = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    input_orders: dict = field(default_factory=dict)  # weight -> the order its grid takes its inputs in
    failure: BaseException | None = None  # what stopped a postponed weight while OpenVINO was saving
    allow_nonfinite: bool = False
    nonfinite: dict = field(default_factory=dict)  # weight -> NaN/Inf values written (allow_nonfinite)
    # the IR's postponed constants, held until save_ir has written them (ir/postponed.py: why)
    constants: PostponedConstants = field(default_factory=PostponedConstants)
    # where the biggest of them are made while save_ir writes them (ir/spill.py: why)
    spill: Spill = field(default_factory=Spill)
    # the grid weights' decodes, each run while the weight before it is written
    ahead: DecodeAhead = field(default_factory=DecodeAhead)

    def __post_init__(self):
        require_source_for(self.variant, self.source.kind)
        if self.streamed and self.observe is not None:
            raise Gguf2ovError("streamed weights are made while the IR is saved: they cannot be observed as they are built")
        if self.variant.nncf:
            from ..finite import NonfiniteError
            from .nncf_weights import plan_modes

            try:
                self.plan = plan_modes(self.variant, self.compressed_weights(),
                                       values=lambda name: self.values(name, count=False),
                                       scores=self._scores(), embeddings=self.source.embeddings,
                                       last_shared=self.source.last_matmul_shared, held=self.source.int8_weights)
            except NonfiniteError:
                raise  # a weight NNCF would score, not a choice NNCF would refuse
            except Gguf2ovError as e:
                raise Gguf2ovError(f"NNCF cannot compress the model as {self.variant.name}: {e.message}",
                                   hint=e.hint) from e

    def compressed_weights(self) -> list[tuple[str, tuple]]:
        """Every weight NNCF compresses (the 2-D tensors: Linear weights and embedding tables, and the
        [E, N, K] experts of batched MatMuls), in the graph's order (the order NNCF walks the model in).
        The weights the source keeps in float32 (a router) are left out, as an ignored scope leaves them."""
        kept, batched = set(self.source.kept), set(self.source.batched)
        return [(n, s) for n, s in self.source.expected.items()
                if (len(s) == 2 or n in batched) and n not in kept]

    def _scores(self) -> dict | None:
        """NNCF's data-free scores, read in row chunks, when a ratio < 1 needs them and weights stream."""
        variant = self.variant
        if not self.streamed or variant.bits != 4 or (variant.ratio or 1.0) >= 1:
            return None
        from .nncf_weights import streamed_sensitivity

        return {name: streamed_sensitivity(self.rows(name, count=False), shape)
                for name, shape in self.compressed_weights()}

    def stored_bytes(self) -> int:
        """The bytes the IR will hold for its weights: every weight in this variant's form, every other
        tensor (norms, biases) in f32, and the weights' decompression subgraphs in the .xml; what a disk
        check adds up before anything is made (the graph's own nodes are its builder's to add)."""
        weights = dict(self.compressed_weights())
        return sum(self.tensor_bytes(name, weights) for name in self.source.expected)

    def scratch_bytes(self, names=None) -> int:
        """The disk the scratch files of the IR's biggest weights (ir/spill.py) take while it is saved, beside
        `stored_bytes`: every one is held until the save ends. `names`: those weights only (default: all)."""
        names = [n for n, _ in self.compressed_weights()] if names is None else names
        return sum(self.variant.format.scratch_bytes(self, name) for name in names)

    def tensor_bytes(self, name: str, weights: dict | None = None) -> int:
        """The bytes the IR holds for tensor `name` (`stored_bytes`'s term; `weights`: compressed_weights(),
        when made already)."""
        weights = dict(self.compressed_weights()) if weights is None else weights
        form = self.variant.format
        if name in weights:
            return form.stored_bytes(self, name) + form.xml_bytes(self, name)
        return 4 * int(np.prod(self.source.expected[name], dtype=np.int64))

    def weight(self, name: str):
        if name in self.source.kept:  # a router decides discretely: float32 in every format
            output, values = self.postponed(name, "f32"), None
        else:
            output, values = self.variant.format.make(self, name)
        if self.observe is not None:
            self.observe(name, output, values)
        return output

    def vector(self, name: str) -> np.ndarray:
        return self.values(name)

    def values(self, name: str, count: bool = True) -> np.ndarray:
        """The source's float32 values of `name`, their NaN and Inf refused (or, allowed, counted unless
        not `count`)."""
        values = self.source.f32(name)
        self.check_finite(name, values, count=count)
        return values

    def check_finite(self, name: str, values, written=None, what: str = "values", total: int | None = None,
                     written_as: str | None = None, count: bool = True) -> None:
        """Refuse (or, allowed, count) the NaN and Inf of what is made for `name`: `values`, the source's
        (a chunk of them), or the file's own fields (`what`: "quantization scales" of a grid); `written`,
        when given, what the IR stores of them in `written_as` (float16 constants, NNCF's scales), whose
        Inf beyond NaN/Inf in `values` are values too large for it. `total`: how many `what` the weight
        has (default: its elements). `count`: False for a read that writes nothing (NNCF's scores)."""
        from ..finite import ALLOW_HINT, count_nonfinite, nonfinite_error

        stored = count_nonfinite(values) if values is not None else 0
        bad = max(stored, count_nonfinite(written)) if written is not None else stored
        if not bad:
            return
        if self.allow_nonfinite:
            if count:
                self.nonfinite[name] = self.nonfinite.get(name, 0) + bad
            return
        elements = int(np.prod(self.source.expected[name], dtype=np.int64))
        source = "GGUF" if self.source.kind == "gguf" else "checkpoint"
        if stored:
            raise nonfinite_error(self.source.where(name), stored, total or elements, what, source)
        raise nonfinite_error(self.source.where(name), bad, total or elements, what, source, too_large_for=written_as,
                              hint="values this large mostly mean broken data in the file; --weight-format fp32 keeps "
                                   f"them, {ALLOW_HINT}")

    def input_order(self, name: str):
        """The order the weight made for `name` takes its inputs in (x[..., order]), when it keeps the
        file's column order (a GGUF grid whose map op moves columns); None: the inputs as they are."""
        return self.input_orders.get(name)

    def grid_form(self, name: str) -> dict:
        """The `grid_weight` flags of weight `name` (`folded`, `split`, `gather`)."""
        if self.grid not in GRIDS:
            raise Gguf2ovError(f"unknown grid form {self.grid!r}", hint=f"use {', '.join(GRIDS)}")
        table = self.gather(name)
        return {"folded": self.grid != "compact", "gather": table,
                "split": self.grid == "split" and not table and name not in self.whole}

    def gather(self, name: str) -> bool:
        """Whether `name` is an embedding table (read by a Gather, not multiplied by a MatMul)."""
        return name in self.source.embeddings

    def rows(self, name: str, count: bool = True):
        """rows(start, stop): rows of the source tensor as float32, read only as far as asked, their NaN
        and Inf refused (or, allowed, counted unless not `count`) as they are read."""
        def rows(start, stop):
            values = self.source.f32_rows(name, start, stop)
            self.check_finite(name, values, count=count)
            return values

        return rows

    def postponing(self, weight: str):
        """postpone(type, shape, make, name=None) -> a PostponedConstant whose failure stops the save
        with its own error (see `failure`)."""
        import openvino as ov

        def postpone(kind, dims, make, name=None):
            def values():
                try:
                    return make()
                except BaseException as e:  # OpenVINO's serializer would turn it into its own exception
                    self.failure = e
                    raise

            kind = kind if isinstance(kind, ov.Type) else getattr(ov.Type, kind)
            return self.constants.make(kind, ov.Shape(list(dims)), values, name=name or f"self.{weight}")

        return postpone

    def postponed(self, name: str, dtype: str):
        """A constant of the source's values that OpenVINO asks for while it writes the .bin ("f32"
        or "f16"), filled in row chunks: a float32 copy of a whole embedding table is never made."""
        import openvino as ov
        from openvino import opset13 as ops

        from .nncf_weights import row_chunks

        shape = self.source.expected[name]
        kind = ov.Type.f16 if dtype == "f16" else ov.Type.f32

        def values():
            out = ov.Tensor(kind, ov.Shape(list(shape)))
            rows = out.data.reshape(shape[0], -1)
            for start, stop in row_chunks(shape[0], int(np.prod(shape[1:], dtype=np.int64))):
                chunk = self.source.f32_rows(name, start, stop).reshape(stop - start, -1)
                with np.errstate(over="ignore"):  # beyond the float16 range: Inf, counted here
                    rows[start:stop] = chunk
                self.check_finite(name, chunk, rows[start:stop] if dtype == "f16" else None, written_as="float16")
            return out

        const = self.postponing(name)(kind, shape, values, f"self.{name}")
        if dtype == "f32":
            return const.output(0)
        # marked as decompression when saved (mark_decompression), so the CPU plugin keeps it f16
        return ops.convert(const.output(0), "f32").output(0)


def save_ir(ov_model, out_dir, forms: WeightForms | None = None) -> None:
    """Save the IR as openvino_model.xml/.bin; postponed weights are made one at a time while the
    .bin is written, and the format's own step runs on the saved IR.

    A weight that fails to load while OpenVINO writes (a corrupt tensor, Ctrl-C) stops the save
    with its own error, not OpenVINO's rewording of it. Written or not, the postponed constants are
    released then (their makers hold the source): the model is not to be used after.
    """
    from pathlib import Path

    import openvino as ov

    from ..names import IR_XML

    from ..outputs import writing, written_back

    xml = Path(out_dir) / IR_XML
    if forms is not None:
        forms.spill.directory = Path(out_dir)
    try:
        with writing(xml.with_suffix(".bin")), written_back(xml.with_suffix(".bin")):  # the .bin fills a disk
            ov.save_model(ov_model, str(xml), compress_to_fp16=False)
    except BaseException:
        if forms is not None and forms.failure is not None:
            raise forms.failure from None
        raise
    finally:
        if forms is not None:
            forms.ahead.close()
            forms.constants.release()
            forms.spill.release()
            forms.spill.directory = None
    if forms is not None and forms.variant.format.after_save is not None:
        forms.variant.format.after_save(xml)


def ir_size(path) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(path).glob("openvino_model.*"))
