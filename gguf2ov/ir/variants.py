"""Weight variants of an IR, one registry entry per format: how each weight enters the IR, what the
IR stores, what it is compared with, and the tolerance it is held to.

A variant is named the way it is built: `fp32`, `fp16`, `int8` / `int8_sym` (per channel),
`int4_asym_g16`, `int4_sym_g128`, ... (NNCF, with `_r0.8` for a ratio and `_all` for all layers),
and `gguf`, which rebuilds every weight from the codes, scales and minimums the GGUF file held
(`gguf/transcode.py`) instead of letting NNCF choose new ones. Nothing outside this module tells
formats apart by name: a new format is one `Format` entry here.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import Gguf2ovError

DEFAULT_GROUP_SIZE = 16  # a Q4_K sub-block is 32 wide: 16 divides it, so no group straddles two grids
# A target's int4 default: optimum-cli's for a model it has no preset for (_DEFAULT_4BIT_WQ_CONFIG:
# asymmetric, group 128, ratio 1.0), so that `gguf2ov target --weight-format int4` is what users get
# from optimum-cli.
TARGET_GROUP_SIZE = 128
# What int4 does with a weight whose input width the group does not divide (gpt-oss-20b's 2880, Gemma 4
# 26B-A4B's experts of 704, a fixture's 32): optimum-cli's --group-size-fallback values gguf2ov takes.
# A target takes "adjust" (the largest power of two dividing the width, at least 32, else int8) so that
# `--weight-format int4` holds every geometry; a draft's variants "error" (drift skips what cannot apply).
GROUP_FALLBACKS = ("error", "adjust")
TARGET_GROUP_FALLBACK = "adjust"
DEFAULT_DRIFT_VARIANTS = (
    "fp32", "int8",
    "int4_sym_g16", "int4_asym_g16", "int4_sym_g32", "int4_asym_g32", "int4_sym_g128", "int4_asym_g128",
    "gguf",
)
# What the lean form (int4 at group 128) trades, measured (benchmarks/target_fidelity.py --fixtures all;
# docs/targets.md, "The lean form"): the CPU plugin's run-time bits a weight against the grid's folded forms
# (benchmarks/runtime_bytes.py), and the fixtures' logits against the file's exact grid.
LEAN_TRADE = ("NNCF's int4, the lean form at group 128: about 5 bits a weight at run time where the file's grid takes "
              "6 to 10, for fidelity: NNCF requantizes the file's weights (on the fixture targets, KLD 3e-4 to 1e-2 "
              "nats a token and top-1 agreement 97-99.8% against the grid; docs/targets.md, The lean form)")
# What the exact grid's build says of the lean form, by name: at Qwen3-8B's geometry the lean target's pair
# decoded 2.8x as fast as the folded grid's, and 2.0x llama.cpp's pair on the same two files, with an AVX512-VNNI
# CPU, whose int8 path makes its verify steps cheap (benchmarks/bench_side_by_side.py padded-8b;
# docs/targets.md, "What it buys"). The exact grid stays the default: it is the file's function.
LEAN_OFFER = ("the lean form, --weight-format int4 (run: --target-format int4), trades the file's exact function "
              "for speed and memory: at Qwen3-8B's geometry its pair decoded 2.8x as fast as this form's on a CPU with "
              "AVX512-VNNI (docs/targets.md, The lean form)")
_NNCF_NAME = re.compile(r"^int(?P<bits>[48])(?:_(?P<sym>sym|asym))?(?:_g(?P<g>\d+))?(?:_r(?P<r>[0-9.]+))?(?P<all>_all)?$")


# --- how each format makes a weight ------------------------------------------------------------------
# `forms` is the WeightForms of the IR being built (ir/weights.py): its `source` hands out the
# tensors, `postponed(name, dtype)` makes a constant OpenVINO fills while it writes the .bin
# (`postponing` one of any content: a target's weights are all made so), `plan` holds NNCF's
# per-weight decisions. Each returns (the weight's output, the source values it read or None).

def _float_weight(dtype: str):
    def make(forms, name):
        return forms.postponed(name, dtype), None

    return make


def _elements(forms, name) -> int:
    shape = forms.source.expected[name]
    return int(np.prod(shape, dtype=np.int64))


def _float_bytes(width: int):
    return lambda forms, name: width * _elements(forms, name)


def _grid_bytes(forms, name) -> int:
    from ..gguf.transcode import grid_bytes

    grid = _stored_grid(forms, name)
    if grid is None:
        return 4 * _elements(forms, name)
    return grid_bytes(grid[1], forms.source.expected[name], **forms.grid_form(name))


def _grid_scratch_bytes(forms, name) -> int:
    """The scratch file a weight on the file's grid is decoded into while a streamed IR is saved (ir/spill.py)."""
    from ..gguf.transcode import grid_constants
    from .spill import scratch_bytes

    grid = _stored_grid(forms, name)
    if grid is None or not forms.streamed:
        return 0
    return scratch_bytes(grid_constants(grid[1], forms.source.expected[name], **forms.grid_form(name)))


def _grid_xml_bytes(forms, name) -> int:
    if _stored_grid(forms, name) is None:
        return 0
    # the file's own fields: ~8.5 KB of nodes a weight (Q4_K/Q6_K); folded: ~3.1 KB; split: ~6 KB
    form = forms.grid_form(name)
    return 6_000 if form["split"] else 3_150 if form["folded"] else 8_550


def _nncf_xml_bytes(forms, name) -> int:
    spec = forms.plan[name]
    return 3_150 if spec.bits == 8 else 2_800 if spec.sym else 4_150


def _nncf_bytes(forms, name) -> int:
    return nncf_bytes(forms.plan[name], forms.source.expected[name])


def nncf_bytes(spec, shape) -> int:
    """NNCF's constants for one weight (an nncf_weights.WeightSpec): codes, an f16 scale per group (or
    output channel) and, asymmetric, a zero point per group of the codes' width."""
    n, rows = int(np.prod(shape, dtype=np.int64)), int(shape[0])
    groups = rows if spec.group_size == -1 else n // spec.group_size
    zero_points = 0 if spec.sym else groups * spec.bits / 8
    return int(n * spec.bits / 8 + 2 * groups + zero_points)


def _stored_grid(forms, name):
    """(raw bytes, GGML type, input order or None) of a weight that keeps the file's own grid, else None
    (a float tensor in the file, or one the map's ops rearrange beyond whole rows or columns). A grid
    whose columns the map moves (qwen35's tiled value heads in ssm_out) stays in the file's order, and
    the IR takes its inputs in `input order`."""
    from ..gguf.transcode import has_grid

    stored = forms.source.quantized(name)
    if stored is not None and has_grid(stored[1]):
        return stored[0], stored[1], None
    moved = getattr(forms.source, "quantized_columns", lambda n: None)(name) if not forms.gather(name) else None
    if moved is not None and has_grid(moved[1]):
        return moved
    return None


def _grid_weight(forms, name):
    from ..gguf.transcode import grid_weight

    grid = _stored_grid(forms, name)
    if grid is None:
        return forms.postponed(name, "f32"), None  # a float tensor in the file: its values, exactly
    raw, qtype, order = grid
    forms.transcoded.append(name)
    if order is not None:
        forms.input_orders[name] = order
    postpone = forms.postponing(name) if forms.streamed else None

    def check(values, total):
        forms.check_finite(name, values, what="quantization scales", total=total)

    return grid_weight(raw, qtype, forms.source.expected[name], postpone=postpone, check=check,
                       spill=forms.spill if forms.streamed else None, ahead=forms.ahead if forms.streamed else None,
                       **forms.grid_form(name)), None


def _nncf_weight(forms, name):
    from .nncf_weights import compress_weight, float_constants, streamed_compression

    spec, constant = forms.plan[name], f"self.{name}"

    def check(scales, total):  # finite values whose float16 scale overflows (NaN values are counted as read)
        forms.check_finite(name, None, scales, "NNCF scales", total, "float16", count=name not in forms.nonfinite)

    if forms.streamed:  # a target's: compressed in row chunks while the .bin is written
        return streamed_compression(forms.rows(name), forms.source.expected[name], spec, forms.postponing(name),
                                    constant, forms.gather(name), check=check,
                                    probe_rows_of=forms.rows(name, count=False)), None
    values = forms.values(name)
    output = compress_weight(values, spec, name=constant, gather=forms.gather(name))
    scales = float_constants(output)
    for data in scales:
        check(data, sum(d.size for d in scales))
    return output, values


# --- what a weight holds at run time ------------------------------------------------------------------
# The CPU plugin repacks each MatMul weight into private memory at the first inference: its codes (4 bits
# for u4, i4 and f4e2m1; 8 for u8 and i8, 5- and 6-bit codes running as u8) and an f32 scale and an f32
# zero point per group; f16 weights as f32. An embedding Gather reads its table from the mapped file.
# Measured: benchmarks/runtime_bytes.py (openvino 2026.4.1, f32 hint; FullyConnected, an expert
# GatherMatmul and a Gather; bits a weight of private memory after the first inference, its fixed
# ~7 MiB a model aside). Each returns (forms, name, kernel) -> bits a weight; kernel: "fc" | "experts" |
# "gather".
RUNTIME_FLOAT_BITS = 32  # f32, and f16 decompressed into it (32.0 measured for f16 weights)


def _float_runtime(forms, name, kernel) -> float:
    return 0.0 if kernel == "gather" else RUNTIME_FLOAT_BITS


def _nncf_runtime(forms, name, kernel) -> float:
    spec = forms.plan.get(name)
    if spec is None:  # a weight NNCF leaves alone (a router): float32
        return _float_runtime(forms, name, kernel)
    if kernel == "gather":  # the scales a compressed table's Gather converts (int4 g128: 0.5, int8 per row: 0)
        return 0.5 if spec.bits == 4 else 0.0
    group = spec.group_size if spec.group_size > 0 else forms.source.expected[name][-1]
    return spec.bits + 64 / group  # int4 g128: 4.5 (4.5, and 4.4 symmetric, measured); g32: 6.0; int8: 8.0


# The file's own grid at run time (measured): folded, 4-bit codes take 6 bits a weight and 5-, 6- and
# 8-bit codes 10 (Q6_K's groups of 16 have a constant zero point; Q8_0's i8 take one per group);
# MXFP4 5 (f4e2m1 codes, an f32 scale per 32) in a FullyConnected and 9 as an expert (i8 codes: its
# GatherMatmul takes no f4e2m1); the compact form keeps its stored factorisation beside the repacked
# codes (Q4_K 8.1, Q6_K 20.2; elsewhere taken as folded plus stored).
_FOUR_BIT_GRIDS = {"Q4_K", "Q4_0", "Q4_1"}
_COMPACT_RUNTIME_BITS = {"Q4_K": 8.1, "Q6_K": 20.2}


def _grid_runtime(forms, name, kernel) -> float:
    from ..gguf.transcode import grid_bytes

    grid = _stored_grid(forms, name)
    if grid is None:
        return _float_runtime(forms, name, kernel)
    qtype, shape, form = grid[1], forms.source.expected[name], forms.grid_form(name)
    if kernel == "gather":
        return 1.0 if qtype.name == "Q8_0" else 0.0
    if qtype.name == "MXFP4":
        return 9.0 if kernel == "experts" else 5.0
    folded = 6.0 if qtype.name in _FOUR_BIT_GRIDS else 10.0
    stored = 8 * grid_bytes(qtype, shape, **form) / max(1, _elements(forms, name))
    if form["split"]:
        return min(folded, stored)  # Q4_K and Q5_K split: their stored bits (5.3 for Q4_K, measured)
    if form["folded"]:
        return folded
    return _COMPACT_RUNTIME_BITS.get(qtype.name, folded + stored)


def _nncf_rt_info(model, variant, ignored=()) -> None:
    from .nncf_weights import write_nncf_rt_info

    write_nncf_rt_info(model, variant, ignored)


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


@dataclass(frozen=True)
class Format:
    name: str
    stores: str                    # what the IR holds, for help texts and reports
    make: Callable                 # (forms, name) -> (weight output, source values read or None)
    stored_bytes: Callable         # (forms, name) -> the bytes the weight takes in the .bin
    # verify's checkpoint-match: max |OV - reference| relative to max(1, max |reference|). Measured on
    # a tiny draft over two steps: f32 4.8e-7 (1.7e-6 on a larger one), fp16 weights 1.5e-3 at a
    # reference scale of 4.1; the GGUF grid holds the dequantized values up to float32 rounding.
    # None: compressed integer weights are not held to a tolerance (`drift` measures them).
    tolerance: float | None
    # the bytes its decompression subgraph adds to the .xml (the disk estimate's; measured on this
    # project's draft and target IRs, openvino 2026.4.1): (forms, name) -> bytes
    xml_bytes: Callable = lambda forms, name: 0
    needs_gguf: bool = False       # the file's own grid: only a GGUF source has one
    compressed: bool = True        # integer codes in the IR (optimum then leaves the KV cache in f32)
    nncf_bits: int | None = None   # NNCF's weight compression at this width
    after_save: Callable | None = None   # (xml path) -> None, once the IR is written
    # (forms, name) -> the bytes of the scratch file the weight is made in while the IR is saved (ir/spill.py)
    scratch_bytes: Callable = lambda forms, name: 0
    annotate: Callable | None = None     # (ov.Model, Variant[, ignored MatMuls]) -> None: the rt_info it adds
    # (forms, name, kernel) -> bits a weight of private memory at run time (the CPU plugin's repacked form)
    runtime_bits: Callable = _float_runtime
    # what a target in this form trades against its GGUF's own grid, said when one is built from a GGUF
    trade: str = ""
    # another form a target built from a GGUF in this one could take, and what it would trade, said by name
    alternative: str = ""


FORMATS = {f.name: f for f in [
    Format("fp32", "float32 constants", _float_weight("f32"), _float_bytes(4), tolerance=1e-4, compressed=False),
    Format("fp16", "float16 constants (decompressed by the plugin)", _float_weight("f16"), _float_bytes(2),
           xml_bytes=lambda forms, name: 490, tolerance=1e-2, compressed=False,
           after_save=lambda xml: mark_decompression(xml)),  # NNCF's own f16 Converts stay as NNCF wrote them
    Format("int8", "NNCF int8 per channel", _nncf_weight, _nncf_bytes, xml_bytes=_nncf_xml_bytes, tolerance=None,
           nncf_bits=8, annotate=_nncf_rt_info, runtime_bits=_nncf_runtime),
    Format("int4", "NNCF int4 per group (int8 where NNCF keeps a backup)", _nncf_weight, _nncf_bytes,
           xml_bytes=_nncf_xml_bytes, tolerance=None, nncf_bits=4, annotate=_nncf_rt_info, runtime_bits=_nncf_runtime,
           trade=LEAN_TRADE),
    Format("gguf", "the GGUF's own codes, scales and minimums", _grid_weight, _grid_bytes, xml_bytes=_grid_xml_bytes,
           tolerance=1e-4, needs_gguf=True, scratch_bytes=_grid_scratch_bytes, runtime_bits=_grid_runtime,
           alternative=LEAN_OFFER),
]}


@dataclass(frozen=True)
class Variant:
    weight_format: str  # a FORMATS key
    group_size: int | None = None  # int4 only; int8 is per channel
    sym: bool = False
    ratio: float | None = None
    all_layers: bool = False
    # int4, a weight whose input width the group does not divide: "error" (refused, as optimum-cli's
    # default) or "adjust" (NNCF's GroupSizeFallbackMode.ADJUST: the largest power of two that divides the
    # width, if at least 32, else NNCF's backup int8), a target's default (GROUP_FALLBACKS)
    group_fallback: str = "error"

    @property
    def format(self) -> Format:
        return FORMATS[self.weight_format]

    @property
    def nncf(self) -> bool:
        return self.format.nncf_bits is not None

    @property
    def bits(self) -> int | None:
        return self.format.nncf_bits

    @property
    def name(self) -> str:
        if not self.nncf:
            return self.weight_format
        if self.bits == 8:
            name = "int8_sym" if self.sym else "int8"
        else:
            name = f"int4_{'sym' if self.sym else 'asym'}_g{self.group_size}"
        if self.ratio is not None and self.ratio != 1.0:
            name += f"_r{self.ratio:g}"
        return name + ("_all" if self.all_layers else "")

    @property
    def flags(self) -> str:
        """The command-line flags that make this variant (`variant_from_flags`'s)."""
        return " ".join([f"--weight-format {self.weight_format}",
                         *([f"--group-size {self.group_size}"] if self.group_size is not None else []),
                         *(["--sym"] if self.sym else []),
                         *([f"--ratio {self.ratio:g}"] if self.ratio is not None and self.ratio != 1.0 else []),
                         *(["--all-layers"] if self.all_layers else [])])


_PLAIN = tuple(n for n, f in FORMATS.items() if f.nncf_bits is None)


def parse_variant(name: str) -> Variant:
    name = name.strip().lower()
    if name in _PLAIN:
        return Variant(name)
    m = _NNCF_NAME.match(name)
    if not m:
        raise Gguf2ovError(
            f"unknown variant {name!r}",
            hint=f"use {', '.join(_PLAIN)}, int8, int8_sym or int4_{{sym|asym}}_g{{16|32|64|128}}[_rRATIO][_all]",
        )
    bits = m["bits"]
    if bits == "8" and m["g"]:
        raise Gguf2ovError(f"variant {name!r}: int8 is per channel and takes no group size")
    ratio = float(m["r"]) if m["r"] else None
    if ratio is not None and not 0 < ratio <= 1:
        raise Gguf2ovError(f"variant {name!r}: the ratio must be in (0, 1]")
    return Variant(
        weight_format=f"int{bits}",
        group_size=(int(m["g"]) if m["g"] else DEFAULT_GROUP_SIZE) if bits == "4" else None,
        sym=m["sym"] == "sym",
        ratio=ratio,
        all_layers=bool(m["all"]),
    )


def variant_from_flags(weight_format: str, group_size=None, sym=False, ratio=None, all_layers=False,
                       default_group_size: int = DEFAULT_GROUP_SIZE, group_fallback: str = "error") -> Variant:
    """The optimum-cli-style flags (`--weight-format`, `--group-size`, `--sym`, `--ratio`, `--all-layers`,
    `--group-size-fallback`: GROUP_FALLBACKS, which int4 alone reads)."""
    if group_fallback not in GROUP_FALLBACKS:
        raise Gguf2ovError(f"unknown group size fallback {group_fallback!r}", hint=f"use {', '.join(GROUP_FALLBACKS)}")
    fmt = FORMATS.get(weight_format)
    if fmt is None:
        raise Gguf2ovError(f"unknown weight format {weight_format!r}", hint=f"use {', '.join(FORMATS)}")
    if fmt.nncf_bits is None:
        if group_size is not None or sym or ratio is not None or all_layers:
            raise Gguf2ovError(
                f"--group-size, --sym, --ratio and --all-layers apply to int8/int4, not to --weight-format {weight_format}"
            )
        return Variant(weight_format)
    if fmt.nncf_bits == 8:
        if group_size is not None:
            raise Gguf2ovError("--group-size applies to int4 only: int8 is per channel")
        return Variant(weight_format, sym=sym, ratio=ratio, all_layers=all_layers)
    return Variant(weight_format, group_size or default_group_size, sym, ratio, all_layers, group_fallback)


def require_source_for(variant: Variant, source_kind: str) -> None:
    """A format that carries the file's own grid needs a GGUF source."""
    if variant.format.needs_gguf and source_kind != "gguf":
        raise Gguf2ovError(f"the {variant.name} variant carries the GGUF's own quantization grid: the source must "
                           "be a GGUF file, not a checkpoint folder")


# --- what an IR stores, read back -----------------------------------------------------------------------

VARIANT_RT_INFO = ("gguf2ov", "variant")


def format_of_ir(model) -> Format:
    """The format an IR's weights are in: the variant gguf2ov recorded, or for an IR from elsewhere
    what its weight constants hold (float16 -> fp16, integer -> int8, else fp32)."""
    if model.has_rt_info(list(VARIANT_RT_INFO)):
        recorded = model.get_rt_info(list(VARIANT_RT_INFO)).astype(str)
        try:
            return parse_variant(recorded).format
        except Gguf2ovError:
            pass  # a name of another version: read the constants
    from .irweights import weight_constants

    types = {src.get_output_element_type(0) for src in weight_constants(model).values()}
    if any(not t.is_real() for t in types):
        return FORMATS["int8"]
    return FORMATS["fp16"] if any(t.get_type_name() in ("f16", "bf16") for t in types) else FORMATS["fp32"]
