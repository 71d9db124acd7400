"""Weight compression of an exported draft IR: NNCF variants and the GGUF grid transcode.

A variant is named the way it is built: `fp32`, `fp16`, `int8` / `int8_sym` (per channel),
`int4_asym_g16`, `int4_sym_g128`, ... (NNCF, with `_r0.8` for a ratio and `_all` for all layers),
and `gguf`, which rebuilds every weight from the codes, scales and minimums the GGUF file held
(see transcode.py) instead of letting NNCF choose new ones.
"""

import re
from dataclasses import dataclass

from .errors import Gguf2ovError

DEFAULT_GROUP_SIZE = 16  # a Q4_K sub-block is 32 wide: 16 divides it, so no group straddles two grids
DEFAULT_DRIFT_VARIANTS = (
    "fp32", "int8",
    "int4_sym_g16", "int4_asym_g16", "int4_sym_g32", "int4_asym_g32", "int4_sym_g128", "int4_asym_g128",
    "gguf",
)
_NNCF_NAME = re.compile(r"^int(?P<bits>[48])(?:_(?P<sym>sym|asym))?(?:_g(?P<g>\d+))?(?:_r(?P<r>[0-9.]+))?(?P<all>_all)?$")


@dataclass(frozen=True)
class Variant:
    weight_format: str  # fp32 | fp16 | int8 | int4 | gguf
    group_size: int | None = None  # int4 only; int8 is per channel
    sym: bool = False
    ratio: float | None = None
    all_layers: bool = False

    @property
    def name(self) -> str:
        if self.weight_format in ("fp32", "fp16", "gguf"):
            return self.weight_format
        if self.weight_format == "int8":
            name = "int8_sym" if self.sym else "int8"
        else:
            name = f"int4_{'sym' if self.sym else 'asym'}_g{self.group_size}"
        if self.ratio is not None and self.ratio != 1.0:
            name += f"_r{self.ratio:g}"
        return name + ("_all" if self.all_layers else "")

    @property
    def nncf(self) -> bool:
        return self.weight_format in ("int8", "int4")


def parse_variant(name: str) -> Variant:
    name = name.strip().lower()
    if name in ("fp32", "fp16", "gguf"):
        return Variant(name)
    m = _NNCF_NAME.match(name)
    if not m:
        raise Gguf2ovError(
            f"unknown variant {name!r}",
            hint="use fp32, fp16, gguf, int8, int8_sym or int4_{sym|asym}_g{16|32|64|128}[_rRATIO][_all]",
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


def variant_from_flags(weight_format: str, group_size=None, sym=False, ratio=None, all_layers=False) -> Variant:
    """The export command's optimum-cli-style flags as a variant."""
    if weight_format in ("fp32", "fp16", "gguf"):
        if group_size is not None or sym or ratio is not None or all_layers:
            raise Gguf2ovError(
                f"--group-size, --sym, --ratio and --all-layers apply to int8/int4, not to --weight-format {weight_format}"
            )
        return Variant(weight_format)
    if weight_format == "int8":
        if group_size is not None:
            raise Gguf2ovError("--group-size applies to int4 only: int8 is per channel")
        return Variant("int8", sym=sym, ratio=ratio, all_layers=all_layers)
    if weight_format == "int4":
        return Variant("int4", group_size or DEFAULT_GROUP_SIZE, sym, ratio, all_layers)
    raise Gguf2ovError(f"unknown weight format {weight_format!r}", hint="use fp32, fp16, int8, int4 or gguf")


def compress(ov_model, variant: Variant):
    """Compress an fp32 draft model in place with NNCF; fp32/fp16 return it unchanged (fp16 is applied at save)."""
    if not variant.nncf:
        return ov_model
    import nncf

    mode = {
        ("int8", True): nncf.CompressWeightsMode.INT8_SYM,
        ("int8", False): nncf.CompressWeightsMode.INT8_ASYM,
        ("int4", True): nncf.CompressWeightsMode.INT4_SYM,
        ("int4", False): nncf.CompressWeightsMode.INT4_ASYM,
    }[(variant.weight_format, variant.sym)]
    kwargs = {"mode": mode}
    if variant.weight_format == "int4":
        kwargs["group_size"] = variant.group_size
        kwargs["ratio"] = variant.ratio if variant.ratio is not None else 1.0
    if variant.all_layers:
        kwargs["all_layers"] = True
    from .progress import third_party_output

    try:
        with third_party_output():
            return nncf.compress_weights(ov_model, **kwargs)
    except Exception as e:  # NNCF reports bad group sizes and shapes with its own exception types
        raise Gguf2ovError(f"NNCF could not compress the draft as {variant.name}: {e}") from e


def gguf_grids(gguf_path, map_path=None) -> dict:
    """{HF weight name: AffineCodes} for every block-quantized 2-D weight the GGUF holds."""
    from .maps import open_mapped
    from .quants import affine_codes, has_affine_codes

    mapped = open_mapped(gguf_path, map_path, allow_ambiguous=True)  # target layer ids do not matter here
    grids = {}
    for entry in mapped.plan:
        # An op changes values or row order after dequantization; such a tensor keeps the
        # dequantized fp32 values rather than a grid that no longer matches them.
        if entry.hf_name is None or entry.ops or len(entry.shape) != 2 or not has_affine_codes(entry.qtype):
            continue
        grids[entry.hf_name] = affine_codes(mapped.gguf.raw(entry.gguf_name), entry.qtype).reshape_rows(entry.shape)
    return grids


def apply_variant(ov_model, variant: Variant, gguf_path=None, map_path=None):
    """(model, names of transcoded weights): `variant` applied to an fp32 draft model."""
    if variant.weight_format != "gguf":
        return compress(ov_model, variant), []
    if gguf_path is None:
        raise Gguf2ovError("the gguf variant rebuilds weights from the GGUF's own grid: the source must be a GGUF file")
    from .transcode import transcode

    return ov_model, transcode(ov_model, gguf_grids(gguf_path, map_path))


@dataclass(frozen=True)
class RequantResult:
    variant: str
    path: str
    size_bytes: int
    transcoded: list[str]  # weights rebuilt from the GGUF grid (variant gguf)

    def summary(self) -> list[str]:
        from .report import human_bytes

        extra = f", {len(self.transcoded)} weights on the GGUF grid" if self.transcoded else ""
        return [f"{self.variant}: {self.path} ({human_bytes(self.size_bytes)}{extra})"]


def ir_size(path) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(path).glob("openvino_model.*"))


def requantize_draft(fp32_dir, out_dir, variant: Variant, gguf_path=None, map_path=None,
                     overwrite: bool = False, provenance_extra: dict | None = None) -> RequantResult:
    """Build `variant` of an exported fp32 draft into `out_dir` (a complete, attachable draft)."""
    import json
    import shutil
    from pathlib import Path

    import openvino as ov

    from .outputs import atomic_dir, atomic_write_text
    from .provenance import provenance

    fp32_dir = Path(fp32_dir)
    model, transcoded = apply_variant(ov.Core().read_model(str(fp32_dir / "openvino_model.xml")), variant,
                                      gguf_path, map_path)
    with atomic_dir(out_dir, overwrite=overwrite, inputs=(fp32_dir, gguf_path)) as tmp:
        ov.save_model(model, str(tmp / "openvino_model.xml"), compress_to_fp16=variant.weight_format == "fp16")
        if (fp32_dir / "config.json").is_file():
            shutil.copy2(fp32_dir / "config.json", tmp / "config.json")
        sources = {"fp32_draft": fp32_dir / "openvino_model.bin"}
        if gguf_path:
            sources["gguf"] = gguf_path
        options = {"variant": variant.name, **(provenance_extra or {})}
        atomic_write_text(tmp / "gguf2ov.json", json.dumps(provenance(sources, options), indent=2) + "\n")
    return RequantResult(variant.name, str(out_dir), ir_size(out_dir), transcoded)
