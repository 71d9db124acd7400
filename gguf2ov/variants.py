"""Weight variants of an IR (a draft's or a target's) by name: fp32, fp16, NNCF int8/int4, and the GGUF grid.

A variant is named the way it is built: `fp32`, `fp16`, `int8` / `int8_sym` (per channel),
`int4_asym_g16`, `int4_sym_g128`, ... (NNCF, with `_r0.8` for a ratio and `_all` for all layers),
and `gguf`. `requantize` makes the weights of a variant, `nncf_weights` its NNCF settings.
"""

import re
from dataclasses import dataclass

from .errors import Gguf2ovError

DEFAULT_GROUP_SIZE = 16  # a Q4_K sub-block is 32 wide: 16 divides it, so no group straddles two grids
# A target's int4 default: optimum-cli's for a model it has no preset for (_DEFAULT_4BIT_WQ_CONFIG:
# asymmetric, group 128, ratio 1.0), so that `gguf2ov target --weight-format int4` is what users get
# from optimum-cli.
TARGET_GROUP_SIZE = 128
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


def variant_from_flags(weight_format: str, group_size=None, sym=False, ratio=None, all_layers=False,
                       default_group_size: int = DEFAULT_GROUP_SIZE) -> Variant:
    """The export and target commands' optimum-cli-style flags as a variant."""
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
        return Variant("int4", group_size or default_group_size, sym, ratio, all_layers)
    raise Gguf2ovError(f"unknown weight format {weight_format!r}", hint="use fp32, fp16, int8, int4 or gguf")
