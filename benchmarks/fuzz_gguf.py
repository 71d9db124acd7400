"""Structural mutation fuzzer for gguf2ov: hostile GGUFs through `inspect`, `convert`, `check` and
`target`.

Each case takes a seed file (`inspect`, `convert` and `check`: a fixture draft,
fixtures/tiny-dflash/*.gguf, and its checkpoint written in MXFP4 by gguf2ov's GGUF writer, as
`llama-quantize --pure ... MXFP4_MOE` writes it; `target`: a target GGUF, see TARGET_SEEDS), applies one mutation
(sometimes two) and runs one command on the result, in-process in a forked child with an address-space limit
(RLIMIT_AS: the child's size at fork + `--memory-mb`) and a per-case timeout. Mutations cover
what the reader and the maps read:
- every integer field of the file, rewritten raw: version, tensor and metadata counts, string and
  array lengths, value and array item types, dimension counts, dimensions, GGML types, offsets,
  scalar values;
- metadata values rewritten with another type or a hostile value (the keys the maps read first),
  keys added, dropped, renamed or duplicated, general.alignment;
- tensors renamed (layer indices, unknown names, duplicates, control characters), given other
  dimensions, types or offsets, dropped or duplicated, their data written with NaN/Inf (float
  tensors) or Inf/NaN/huge block scales (quantized tensors; MXFP4: E8M0 scale bytes 255 and 254);
- truncations, and bytes flipped in the header.

A case is classified as
  clean        exit 0 (for `check`, also exit 1 with its FAIL report), output valid
  clean_error  exit 1 with exactly one `error:` line, no traceback, nothing left behind
  traceback    an exception escaped the command (or a traceback was printed)
  memory       the address-space limit was hit ("out of memory")
  timeout      the case ran longer than `--timeout`
  crash        the child died by a signal or exited in an unexpected way
  invalid      exit 0 but the output is wrong: a convert output with NaN/Inf weights or config
               values that cannot be right, a target whose IR holds a NaN/Inf constant (after
               OpenVINO's constant folding: the weights as the plugin computes them) or whose
               config.json holds NaN, an inspect --json - that is not JSON; or an error that is
               more than one line, is huge, or left output behind; or a numpy warning on stderr
               (a bad value must be refused by name, not computed with a warning).
Cases are deterministic: case i of an entry point depends only on (--seed, entry point, i);
`--replay convert:123` rebuilds that mutant, prints the mutation and runs it with its traceback.

    python -m benchmarks.fuzz_gguf --cases 10000              # per entry point
    python -m benchmarks.fuzz_gguf --cases 200 --entry convert --seed 7
    python -m benchmarks.fuzz_gguf --cases 300 --entry target --timeout 60
    python -m benchmarks.fuzz_gguf --replay check:4711

Writes benchmarks/results/fuzz-<name>.json and .md (counts per entry point and class, per
mutation and class, the first examples of every class other than clean and clean_error).
"""

import argparse
import contextlib
import faulthandler
import io
import json
import math
import os
import random
import re
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# One core: no BLAS threads in the children (the fuzzer runs next to other work).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from benchmarks.common import REPO, RESULTS, TEST_DATA  # noqa: E402
from gguf2ov.maps.rules import config_get  # noqa: E402

FIXTURES = REPO / "fixtures" / "tiny-dflash"
SEEDS = ("draft-Q4_K_M.gguf", "draft-legacy-Q4_K_M.gguf")
MXFP4_SEED = "draft-MXFP4.gguf"  # written from REFERENCE when the fuzzer starts
REFERENCE = FIXTURES / "draft-ref"
# `target`'s seeds: the hybrid and MoE fixture targets (Q4_K_M as llama.cpp quantizes: Q4_K, Q5_0, Q6_K,
# Q8_0), llama.cpp's own qwen35 and qwen35moe F16 files, and a qwen3 Q4_K_M made from the fixture
# target's checkpoint by gguf2ov's writer when the run starts (QWEN3_SEED)
TARGET_SEEDS = {"tiny-hybrid/target-Q4_K_M.gguf": REPO / "fixtures" / "tiny-hybrid" / "target-Q4_K_M.gguf",
                "tiny-moe/target-Q4_K_M.gguf": REPO / "fixtures" / "tiny-moe" / "target-Q4_K_M.gguf",
                "qwen35-mtp-llamacpp-F16.gguf": TEST_DATA / "qwen35-mtp-llamacpp-F16.gguf",
                "qwen35moe-mtp-llamacpp-F16.gguf": TEST_DATA / "qwen35moe-mtp-llamacpp-F16.gguf"}
QWEN3_SEED = "qwen3-target-Q4_K_M.gguf"
ENTRIES = ("inspect", "convert", "check", "target")
DRAFT_ENTRIES = ("inspect", "convert", "check")
# `target`'s weight formats, each with its share of the cases: the folded grid (the default), the
# compact grid, fp16 and fp32 constants, NNCF's int8 and int4 (group 16 divides the fixtures' widths)
TARGET_FORMATS = ((), ("--compact-grid",), ("--weight-format", "fp16"), ("--weight-format", "fp32"),
                  ("--weight-format", "int8"), ("--weight-format", "int4", "--group-size", "16"))
TARGET_FORMAT_WEIGHTS = (4, 1, 1, 1, 1, 1)
CLASSES = ("clean", "clean_error", "traceback", "memory", "timeout", "crash", "invalid")
MAX_ERROR_LINE = 5000     # characters; the listings in error lines are capped well below this
EXAMPLES_PER_CLASS = 20

# --- the GGUF model --------------------------------------------------------------------------------
# Parsed here independently of gguf2ov.gguf.read, so that a bug in the reader is not shared.

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_FMT = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "<B",
        T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
GGML_F32, GGML_F16, GGML_Q4_K, GGML_Q6_K, GGML_MXFP4 = 0, 1, 12, 14, 39
# (block size, bytes per block) of the GGML types the seeds hold or mutations give
GGML_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
              11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 24: (1, 1), 25: (1, 2), 26: (1, 4),
              27: (1, 8), 28: (1, 8), 30: (1, 2), 39: (32, 17)}


@dataclass
class Tensor:
    name: str
    dims: list          # ne, as stored
    gtype: int
    offset: int         # relative to the data section


@dataclass
class Model:
    version: int
    kv: list            # [key, vtype, value]; value of an array: (item type, [items])
    tensors: list
    data: bytes         # the data section (from the aligned start to the end of the file)
    tail: bytes = b""   # raw bytes appended after serialisation (none by default)


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("<Q")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8")

    def value(self, vtype):
        if vtype == T_STR:
            return self.string()
        if vtype == T_ARR:
            itype, count = self.take("<I"), self.take("<Q")
            return itype, [self.value(itype) for _ in range(count)]
        value = self.take(_FMT[vtype])
        return bool(value) if vtype == T_BOOL else value


def parse(buf: bytes) -> Model:
    r = _Reader(buf)
    assert r.take("<I") == 0x46554747  # b"GGUF"
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kv = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        kv.append([key, vtype, r.value(vtype)])
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        tensors.append(Tensor(name, dims, r.take("<I"), r.take("<Q")))
    alignment = next((v for k, t, v in kv if k == "general.alignment"), 32)
    start = -(-r.pos // alignment) * alignment
    return Model(version, kv, tensors, buf[start:])


@dataclass
class Field:
    pos: int
    fmt: str
    kind: str           # count, length, type, dim, offset, value, version
    label: str


class _Writer:
    def __init__(self):
        self.out = bytearray()
        self.fields: list[Field] = []

    def put(self, fmt, value, kind=None, label=""):
        if kind:
            self.fields.append(Field(len(self.out), fmt, kind, label))
        self.out += struct.pack(fmt, value)

    def string(self, text, label):
        raw = text.encode("utf-8", "surrogatepass")
        self.put("<Q", len(raw), "length", f"length of {label}")
        self.out += raw

    def value(self, vtype, value, label):
        if vtype == T_STR:
            self.string(value, label)
        elif vtype == T_ARR:
            itype, items = value
            self.put("<I", itype, "type", f"item type of {label}")
            self.put("<Q", len(items), "count", f"count of {label}")
            for i, item in enumerate(items):
                self.value(itype, item, f"{label}[{i}]")
        elif vtype in _FMT:
            fmt = _FMT[vtype]
            if vtype == T_BOOL:
                value = int(value) & 0xFF
            elif fmt in ("<f", "<d"):
                value = float(value)
            else:
                lo, hi = _int_range(fmt)
                value = min(max(int(value), lo), hi)
            self.put(fmt, value, "value", label)
        # an unknown value type has no payload the reader could know the size of


def _int_range(fmt):
    bits = struct.calcsize(fmt) * 8
    return (0, 2**bits - 1) if fmt[-1].isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def serialise(model: Model) -> tuple[bytes, list[Field]]:
    w = _Writer()
    w.out += b"GGUF"
    w.put("<I", model.version, "version", "version")
    w.put("<Q", len(model.tensors), "count", "tensor count")
    w.put("<Q", len(model.kv), "count", "metadata count")
    for key, vtype, value in model.kv:
        w.string(key, f"key {key}")
        w.put("<I", vtype, "type", f"type of {key}")
        w.value(vtype, value, key)
    for t in model.tensors:
        w.string(t.name, f"name of {t.name}")
        w.put("<I", len(t.dims), "dim", f"dimension count of {t.name}")
        for i, d in enumerate(t.dims):
            w.put("<Q", d, "dim", f"ne[{i}] of {t.name}")
        w.put("<I", t.gtype, "type", f"type of {t.name}")
        w.put("<Q", t.offset, "offset", f"offset of {t.name}")
    alignment = next((v for k, t, v in model.kv if k == "general.alignment"), 32)
    if not (isinstance(alignment, int) and 0 < alignment <= 1 << 16 and not alignment & (alignment - 1)):
        alignment = 32  # the reader refuses the file anyway
    w.out += b"\0" * (-len(w.out) % alignment)
    return bytes(w.out) + model.data + model.tail, w.fields


# --- mutations -------------------------------------------------------------------------------------

MAP_KEYS: list[str] = []  # filled by _map_keys()


def _map_keys(arch: str = "dflash") -> list[str]:
    """The GGUF keys the shipped map of `arch` reads (its config rules' sources and conditions), and the
    ones the reader reads itself."""
    from gguf2ov.maps.load import load_map

    amap = load_map(arch)
    keys = set()
    for rule in [*amap.config.values(), *amap.legacy.values()]:
        keys.update(rule.get("from", []))
        for cond in rule.get("ambiguous_when", []):
            keys.update(v for k, v in cond.items() if k in ("has", "lacks"))
    MAP_KEYS[:] = sorted(keys) + ["general.architecture", "general.alignment"]
    return list(MAP_KEYS)


def _interesting_ints(rng, orig, width_fmt, file_size):
    lo, hi = _int_range(width_fmt)
    pool = [0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 63, 64, 255, 256, 1023, 4096, 65535, 2**31 - 1, 2**31, 2**32 - 1,
            2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -1, -2, -(2**31), -(2**63), file_size, file_size - 1]
    if isinstance(orig, int):
        pool += [orig + 1, orig - 1, orig * 2, orig // 2, orig + 2**32, orig * 1000, orig + file_size]
    value = rng.choice(pool) if rng.random() < 0.85 else rng.randrange(lo, hi + 1)
    return value & hi if lo == 0 else max(lo, min(hi, value))


HOSTILE_VALUES = [
    (T_STR, "../../x"), (T_STR, ""), (T_STR, "a" * 5000), (T_STR, "evil\nhint: x\x1b[31m"), (T_STR, "3,6,9"),
    (T_STR, "dflash"), (T_STR, "1e-6"), (T_U32, 0), (T_U32, 1), (T_U32, 2), (T_U32, 3), (T_U32, 7), (T_U32, 255),
    (T_U32, 2**31), (T_U32, 2**32 - 1), (T_I32, -1), (T_I32, -(2**31)), (T_U64, 2**63), (T_U64, 2**64 - 1),
    (T_I64, -1), (T_I64, 2**62), (T_U8, 200), (T_I8, -100), (T_U16, 65535), (T_BOOL, True), (T_BOOL, False),
    (T_F32, float("nan")), (T_F32, float("inf")), (T_F32, float("-inf")), (T_F32, -1.0), (T_F32, 0.0),
    (T_F32, 2.5), (T_F32, 1e38), (T_F32, 1e-45), (T_F64, float("nan")), (T_F64, 1e300), (T_F64, 1.0),
    (T_ARR, (T_U32, [])), (T_ARR, (T_U32, [1])), (T_ARR, (T_U32, [0, 0])), (T_ARR, (T_I32, [-1, -5])),
    (T_ARR, (T_F32, [float("nan"), 2.0])), (T_ARR, (T_F64, [1.5, 2.5])), (T_ARR, (T_STR, ["a", "b"])),
    (T_ARR, (T_BOOL, [True])), (T_ARR, (T_BOOL, [True, False])), (T_ARR, (T_BOOL, [False] * 100)),
    (T_ARR, (T_U32, list(range(2, 102)))), (T_ARR, (T_U64, [2**64 - 1, 3])), (T_ARR, (T_U8, [1] * 300)),
    (T_ARR, (T_STR, [f"t{i}" for i in range(300)])), (T_ARR, (T_F32, [float("inf")] * 100)),
    (T_ARR, (T_U32, [2, 3] * 5000)), (T_ARR, (T_ARR, [(T_U32, [1])])),
]
ADDED_KEYS = ["dflash.vocab_size", "dflash.mask_token_id", "dflash.attention.sliding_window",
              "dflash.attention.sliding_window_pattern", "dflash.target_hidden_size", "dflash.logit_scale",
              "dflash.conv_kernel_size", "dflash.selector_rank", "tokenizer.ggml.padding_token_id",
              "dflash.final_logit_softcapping", "general.alignment", "dflash.block_size", "junk.key"]
# keys added to a target ({arch}: its architecture): the ones its reader and builder read beside the map's
TARGET_ADDED_KEYS = ["general.alignment", "{arch}.rope.scaling.type", "{arch}.rope.dimension_sections",
                     "{arch}.vocab_size", "{arch}.attention.sliding_window", "{arch}.expert_count",
                     "{arch}.expert_used_count", "tokenizer.ggml.padding_token_id", "split.count", "split.no",
                     "junk.key"]


def _added_keys(model) -> list[str]:
    arch = next((v for k, t, v in model.kv if k == "general.architecture" and isinstance(v, str)), "dflash")
    return ADDED_KEYS if arch == "dflash" else [k.replace("{arch}", arch) for k in TARGET_ADDED_KEYS]


@dataclass
class Mutant:
    data: bytes
    steps: list = field(default_factory=list)   # what was done, in words

    @property
    def description(self) -> str:
        return "; ".join(self.steps)


def mutate(seed_bytes: bytes, rng: random.Random, map_keys: list[str]) -> tuple[Mutant, str]:
    """One or two mutations of a seed: (mutant, the first mutation's operator name)."""
    model = parse(seed_bytes)
    steps, ops = [], []
    n = 1 if rng.random() < 0.8 else 2
    raw_ops = []
    for _ in range(n):
        op = rng.choices(list(OPERATORS), weights=[w for _, w in OPERATORS.values()])[0]
        ops.append(op)
        if op in RAW_OPERATORS:
            raw_ops.append(op)
        else:
            steps.append(OPERATORS[op][0](model, rng, map_keys))
    data, fields = serialise(model)
    for op in raw_ops:
        data, step = OPERATORS[op][0](data, fields, rng, model)
        steps.append(step)
    return Mutant(data, steps), ops[0]


def _pick_kv(model, rng, map_keys):
    if model.kv and rng.random() < 0.7:
        read = [kv for kv in model.kv if kv[0] in map_keys]
        if read:
            return rng.choice(read)
    return rng.choice(model.kv) if model.kv else None


def op_meta_value(model, rng, map_keys):
    kv = _pick_kv(model, rng, map_keys)
    if kv is None:
        return "no metadata to change"
    vtype, value = rng.choice(HOSTILE_VALUES)
    if rng.random() < 0.05:
        vtype, value = rng.choice([13, 99, 2**32 - 1]), None  # an unknown value type
    kv[1], kv[2] = vtype, value
    return f"metadata {kv[0]} := {_short(value)} (type {vtype})"


def op_meta_add(model, rng, map_keys):
    key = rng.choice(_added_keys(model) + map_keys)
    vtype, value = rng.choice(HOSTILE_VALUES)
    model.kv.insert(rng.randrange(len(model.kv) + 1), [key, vtype, value])
    return f"metadata {key} added := {_short(value)} (type {vtype})"


def op_meta_drop(model, rng, map_keys):
    kv = _pick_kv(model, rng, map_keys)
    if kv is None:
        return "no metadata to drop"
    model.kv.remove(kv)
    return f"metadata {kv[0]} dropped"


def op_meta_rename(model, rng, map_keys):
    kv = _pick_kv(model, rng, map_keys)
    if kv is None:
        return "no metadata to rename"
    old = kv[0]
    kv[0] = rng.choice([rng.choice(map_keys), rng.choice([k for k, *_ in model.kv]), old + "x", old.upper(), "",
                        old.replace("dflash", "llama"), "a" * 300, "k\n\x1b[0m"])
    return f"metadata key {old} renamed to {_short(kv[0])}"


def op_tensor_rename(model, rng, map_keys):
    t = rng.choice(model.tensors)
    old = t.name
    m = re.match(r"blk\.(\d+)\.(.*)", old)
    choices = [old + ".x", "unknown.weight", "", "a" * 70, "blk.0." + old, old.replace("weight", "bias"),
               rng.choice(model.tensors).name, "x\n\x1b[31m" + old]
    if m:
        choices += [f"blk.{i}.{m.group(2)}" for i in (2, 3, 7, 99, 10**9, 10**12, -1)] + [f"blk.{'9' * 40}.{m.group(2)}",
                                                                                       f"blk.0{m.group(1)}.{m.group(2)}"]
    t.name = rng.choice(choices)
    if rng.random() < 0.2:  # a swap
        other = rng.choice(model.tensors)
        t.name, other.name = other.name, old
        return f"tensors {old} and {t.name} swap names"
    return f"tensor {old} renamed to {_short(t.name)}"


def op_tensor_dims(model, rng, map_keys):
    t = rng.choice(model.tensors)
    old = list(t.dims)
    kind = rng.randrange(6)
    if kind == 0 and len(t.dims) > 1:
        t.dims = t.dims[::-1]
    elif kind == 1:
        t.dims = t.dims + [rng.choice([1, 2, 0, 2**63])]
    elif kind == 2 and len(t.dims) > 1:
        t.dims = t.dims[:-1]
    elif kind == 3:
        i = rng.randrange(len(t.dims))
        t.dims[i] = rng.choice([0, 1, 2, t.dims[i] * 2, t.dims[i] // 2, t.dims[i] + 256, 2**32, 2**63, 2**64 - 1])
    elif kind == 4:
        t.dims = [rng.choice([256, 512, 64]) for _ in range(rng.randint(1, 5))]
    else:
        t.dims = [d * 2 if i == 0 else max(1, d // 2) for i, d in enumerate(t.dims)]
    return f"tensor {t.name} dims {old} -> {t.dims}"


def op_tensor_type(model, rng, map_keys):
    t = rng.choice(model.tensors)
    old = t.gtype
    t.gtype = rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 13, 14, 15, 16, 20, 24, 25, 26, 27, 28, 30, 31, 39, 40,
                          99, 2**31, 2**32 - 1])
    return f"tensor {t.name} type {old} -> {t.gtype}"


def op_tensor_offset(model, rng, map_keys):
    t = rng.choice(model.tensors)
    old = t.offset
    other = rng.choice(model.tensors).offset
    t.offset = rng.choice([0, 1, old + 1, old + 32, other, len(model.data), len(model.data) - 1, 2**32, 2**63,
                           2**64 - 1, old - 32 if old >= 32 else 0])
    return f"tensor {t.name} offset {old} -> {t.offset}"


def op_tensor_drop(model, rng, map_keys):
    t = rng.choice(model.tensors)
    if rng.random() < 0.5:
        model.tensors.remove(t)
        return f"tensor {t.name} dropped"
    model.tensors.insert(rng.randrange(len(model.tensors) + 1), Tensor(t.name, list(t.dims), t.gtype, t.offset))
    return f"tensor {t.name} duplicated"


def op_tensor_data(model, rng, map_keys):
    t = rng.choice(model.tensors)
    data = bytearray(model.data)
    block, size = GGML_SIZES.get(t.gtype, (1, 1))
    n_elements = math.prod(t.dims)
    n_bytes = n_elements // block * size
    if t.offset + n_bytes > len(data):
        return f"tensor {t.name}: data out of range, unchanged"
    poison = rng.choice(["nan", "inf", "-inf", "huge", "scribble"])
    if poison == "scribble":
        at = t.offset + rng.randrange(n_bytes)
        data[at:at + 8] = bytes(rng.randrange(256) for _ in range(8))[:len(data) - at]
    elif t.gtype == GGML_F32:
        value = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "huge": 3.4e38}[poison]
        for _ in range(rng.randint(1, 5)):
            struct.pack_into("<f", data, t.offset + 4 * rng.randrange(n_elements), value)
    elif t.gtype == GGML_MXFP4:  # the E8M0 scale byte leading a block: 255 is no finite scale, 254 overflows
        blk = t.offset + size * rng.randrange(max(1, n_bytes // size))
        data[blk] = 254 if poison == "huge" else 255
    else:
        half = {"nan": 0x7E00, "inf": 0x7C00, "-inf": 0xFC00, "huge": 0x7BFF}[poison]
        if t.gtype == GGML_F16:
            at = t.offset + 2 * rng.randrange(n_elements)
        else:  # a block scale: d (and dmin) of K-quants and Q8_0/Q4_0 lead their block; Q6_K ends with d
            blk = t.offset + size * rng.randrange(max(1, n_bytes // size))
            at = blk + (size - 2 if t.gtype == GGML_Q6_K else rng.choice([0, 2]) if t.gtype == GGML_Q4_K else 0)
        struct.pack_into("<H", data, at, half)
    model.data = bytes(data)
    return f"tensor {t.name} data: {poison}"


def op_version(model, rng, map_keys):
    old = model.version
    model.version = rng.choice([0, 1, 2, 4, 2**31, 2**32 - 1])
    return f"version {old} -> {model.version}"


# raw operators take the serialised bytes and the field table
def _pick_field(fields, rng, map_keys) -> Field:
    """A field of a kind drawn uniformly (a tokenizer's thousands of item values would otherwise
    outnumber the counts, dimensions and offsets), half the time one of a key the map reads."""
    by_kind = defaultdict(list)
    for f in fields:
        by_kind[f.kind].append(f)
    pool = by_kind[rng.choice(sorted(by_kind))]
    if rng.random() < 0.5:
        read = [f for f in pool if any(f.label.startswith(k) or f.label.endswith(k) or f" {k}" in f.label
                                       for k in map_keys)]
        pool = read or pool
    return rng.choice(pool)


def op_int_field(data, fields, rng, model):
    fields = [f for f in fields if f.pos + struct.calcsize(f.fmt) <= len(data)]  # after a truncation
    if not fields:
        return data, "no field left to change"
    f = _pick_field(fields, rng, MAP_KEYS)
    orig = struct.unpack_from(f.fmt, data, f.pos)[0]
    if f.fmt in ("<f", "<d"):
        value = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
    else:
        value = _interesting_ints(rng, orig, f.fmt, len(data))
    buf = bytearray(data)
    struct.pack_into(f.fmt, buf, f.pos, value)
    return bytes(buf), f"{f.kind} field {f.label}: {_short(orig)} -> {_short(value)}"


def op_truncate(data, fields, rng, model):
    fields = [f for f in fields if f.pos < len(data)]
    if rng.random() < 0.5 and fields:
        f = rng.choice(fields)
        cut = f.pos + rng.randrange(struct.calcsize(f.fmt) + 1)
    else:
        cut = rng.randrange(len(data))
    return data[:cut], f"truncated at byte {cut} of {len(data)}"


def op_byte_flip(data, fields, rng, model):
    header_end = max(f.pos for f in fields) + 8 if fields else len(data)
    buf = bytearray(data)
    if not buf:
        return data, "nothing to flip"
    positions = [rng.randrange(min(header_end, len(buf))) for _ in range(rng.randint(1, 8))]
    for at in positions:
        buf[at] ^= 1 << rng.randrange(8)
    return bytes(buf), f"bits flipped at header bytes {positions}"


def op_append(data, fields, rng, model):
    extra = rng.choice([b"\0" * 32, b"GGUF" * 100, os.urandom(0) + bytes(range(256))])
    return data + extra, f"{len(extra)} bytes appended"


OPERATORS = {
    "int_field": (op_int_field, 30), "meta_value": (op_meta_value, 18), "meta_add": (op_meta_add, 5),
    "meta_drop": (op_meta_drop, 4), "meta_rename": (op_meta_rename, 4), "tensor_rename": (op_tensor_rename, 6),
    "tensor_dims": (op_tensor_dims, 6), "tensor_type": (op_tensor_type, 5), "tensor_offset": (op_tensor_offset, 4),
    "tensor_drop": (op_tensor_drop, 3), "tensor_data": (op_tensor_data, 8), "version": (op_version, 1),
    "truncate": (op_truncate, 4), "byte_flip": (op_byte_flip, 3), "append": (op_append, 1),
}
RAW_OPERATORS = {"int_field", "truncate", "byte_flip", "append"}


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- running a case --------------------------------------------------------------------------------

@dataclass
class Outcome:
    entry: str
    index: int
    seed_file: str
    operator: str
    mutation: str
    argv: list
    cls: str
    code: int | None
    seconds: float
    peak_rss_mb: float
    detail: str = ""


def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _child(argv, out_path, err_path, memory_bytes, timeout) -> None:
    code = 71
    try:
        limit = _vm_size() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", write_through=True)
        # a case about to time out leaves its stack, which the timeout's detail quotes
        faulthandler.dump_traceback_later(max(1.0, timeout - 1.0), file=sys.stderr)
        torch = sys.modules.get("torch")
        if torch is not None:  # a parent that ran torch ops (a test process) leaves a thread pool a child cannot use
            torch.set_num_threads(1)
        from gguf2ov.cli import main

        try:
            result = main(argv)
            code = int(result or 0)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001 - anything that escapes main() is what the fuzzer looks for
            sys.stderr.write("FUZZ-ESCAPED\n" + traceback.format_exc())
            code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_forked(argv, scratch: Path, timeout: float, memory_bytes: int):
    """(exit code, -signal, or None on timeout; stdout; stderr; seconds; peak RSS of the child in MiB)."""
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, out_path, err_path, memory_bytes, timeout)
    timed_out = False
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd: poll
        while not _exited(pid):
            if time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(0.005)
    else:
        try:
            timed_out = not select.select([fd], [], [], timeout)[0]
        finally:
            os.close(fd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - start
    code = None if timed_out else os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    read = lambda p: p.read_bytes()[:200_000].decode("utf-8", "replace") if p.exists() else ""  # noqa: E731
    # ru_maxrss of a forked child counts the pages it touched, not those it shares with the fuzzer
    return code, read(out_path), read(err_path), seconds, usage.ru_maxrss / 1024


def _exited(pid: int) -> bool:
    """Whether a child has ended, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def classify(entry: str, code, out: str, err: str, out_dir: Path, scratch: Path, timeout: float,
             seconds: float) -> tuple[str, str]:
    """(class, detail) of a finished case."""
    if code is None:
        frames = [line.strip() for line in err.splitlines() if line.strip().startswith('File "')]
        return "timeout", f"over {timeout:.0f} s" + (f", in {frames[0]}" if frames else "")
    if "FUZZ-ESCAPED" in err or code == 70 or "Traceback (most recent call last)" in err:
        return "traceback", _last_line(err)
    if "error: out of memory" in err or "Cannot allocate memory" in err:
        return "memory", _last_line(err)
    if code < 0:
        return "crash", f"signal {signal.Signals(-code).name}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    leftovers = [p.name for p in scratch.iterdir() if p.name.startswith((".out.", "out"))]
    if warned := NUMPY_WARNING.search(err):
        return "invalid", f"exit {code} with a numpy warning: {warned.group(0)[:200]}"
    if code == 0:
        if errors:
            return "invalid", f"exit 0 with an error line: {errors[0][:200]}"
        if entry in VALIDATORS:
            problems = VALIDATORS[entry](out_dir)
            return ("invalid", "; ".join(problems)[:1000]) if problems else ("clean", "")
        if entry == "inspect" and out.lstrip().startswith("{"):
            try:
                json.loads(out, parse_constant=_refuse_constant)
            except ValueError as e:
                return "invalid", f"inspect --json - is not JSON: {e}"
        return "clean", ""
    if code == 1 and entry == "check" and not errors and ("FAIL:" in out or "PASS:" in out):
        return "clean", "check reported FAIL"
    if code == 1 and len(errors) == 1:
        if len(errors[0]) > MAX_ERROR_LINE:
            return "invalid", f"error line of {len(errors[0])} characters"
        if entry in VALIDATORS and leftovers:
            return "invalid", f"failed {entry} left {leftovers}"
        return "clean_error", errors[0][:300]
    if code == 1 and len(errors) > 1:
        return "invalid", f"{len(errors)} error lines: {errors[0][:200]}"
    return "crash", f"exit code {code}: {_last_line(err)}"


# what numpy's warnings print (`RuntimeWarning: invalid value encountered in log`)
NUMPY_WARNING = re.compile(r"\w*Warning: (?:invalid value|divide by zero|overflow|underflow) encountered[^\n]*")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _refuse_constant(name):
    raise ValueError(f"{name} in JSON")


# --- checking a converted checkpoint, independently of the converter --------------------------------

_POSITIVE = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "max_position_embeddings", "vocab_size", "sliding_window", "target_hidden_size",
             "dflash_config.conv_kernel_size", "dflash_config.conv_group_size", "dflash_config.selector_rank",
             "dflash_config.selector_top_k")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "dflash_config.mask_token_id")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def validate_checkpoint(out_dir: Path) -> list[str]:
    """What is wrong with a converted DFlash checkpoint: config values that cannot be right, NaN or
    Inf weights, tensors that disagree with the config."""
    problems = []
    try:
        config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, ValueError) as e:
        return [f"config.json: {e}"]
    for key in _POSITIVE:
        v = config_get(config, key)
        if v is not None and not (_is_int(v) and v >= 1):
            problems.append(f"{key} = {_short(v)}")
    vocab = config_get(config, "vocab_size")
    for key in _TOKEN_IDS:
        v = config_get(config, key)
        if v is not None and not (_is_int(v) and v >= 0 and (not _is_int(vocab) or v < vocab)):
            problems.append(f"{key} = {_short(v)} (vocab_size {vocab})")
    block = config_get(config, "dflash_config.block_size")
    if not (_is_int(block) and block >= 2):
        problems.append(f"dflash_config.block_size = {_short(block)}")
    # floats as the file must state them (an integer 0 epsilon was once written as rms_norm_eps = 0)
    for key, ok in (("rms_norm_eps", lambda v: 0 < v < 1), ("rope_theta", lambda v: v > 0),
                    ("logit_scale", lambda v: v >= 0), ("final_logit_softcapping", lambda v: v >= 0)):
        v = config_get(config, key)
        if v is not None and not (isinstance(v, float) and math.isfinite(v) and ok(v)):
            problems.append(f"{key} = {_short(v)}")
    ids = config_get(config, "dflash_config.target_layer_ids")
    if not (isinstance(ids, list) and ids and all(_is_int(i) and i >= 0 for i in ids)):
        problems.append(f"dflash_config.target_layer_ids = {_short(ids)}")
    layers = config_get(config, "num_hidden_layers")
    types = config_get(config, "layer_types")
    if types is not None and not (isinstance(types, list) and len(types) == layers
                                  and all(t in ("sliding_attention", "full_attention") for t in types)):
        problems.append(f"layer_types = {_short(types)} for {layers} layers")
    problems += _validate_tensors(out_dir, config)
    return problems


def _validate_tensors(out_dir: Path, config: dict) -> list[str]:
    problems, shapes = [], {}
    for path in sorted(out_dir.glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack_from("<Q", raw, 0)
        header = json.loads(raw[8:8 + n])
        body = memoryview(raw)[8 + n:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            shapes[name] = info["shape"]
            chunk = body[start:end]
            if info["dtype"] == "BF16":
                bits = np.frombuffer(chunk, np.uint16)
                bad = int(np.count_nonzero((bits & 0x7F80) == 0x7F80))
            elif info["dtype"] in ("F16", "F32"):
                bad = int(np.count_nonzero(~np.isfinite(np.frombuffer(chunk, {"F16": np.float16, "F32": np.float32}
                                                                      [info["dtype"]]))))
            else:
                bad = 0
            if bad:
                problems.append(f"{name} holds {bad} NaN/Inf values")
    hidden, ids = config_get(config, "hidden_size"), config_get(config, "dflash_config.target_layer_ids")
    if "fc.weight" in shapes and _is_int(hidden) and isinstance(ids, list) and \
            shapes["fc.weight"] != [hidden, len(ids) * hidden]:
        problems.append(f"fc.weight is {shapes['fc.weight']} for hidden {hidden} and {len(ids)} target layers")
    layer_ids = sorted({int(m.group(1)) for name in shapes if (m := re.match(r"layers\.(\d+)\.", name))})
    n_layers = config_get(config, "num_hidden_layers")
    if layer_ids and layer_ids != list(range(n_layers if _is_int(n_layers) and n_layers <= len(layer_ids) else -1)):
        problems.append(f"tensors for layers {layer_ids[:5]}... but num_hidden_layers {_short(n_layers)}")
    return problems


def validate_target(out_dir: Path) -> list[str]:
    """What is wrong with a built target folder, independently of the builder: its config.json is not
    JSON (or holds NaN), its IR is missing or does not read, or a floating-point constant of the IR is
    NaN or Inf once OpenVINO has folded the constant subgraphs (the weights as the plugin computes them
    from codes, scales and zero points)."""
    import openvino as ov
    from openvino.passes import ConstantFolding, Manager

    try:
        json.loads((out_dir / "config.json").read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, ValueError) as e:
        return [f"config.json: {e}"]
    try:
        model = ov.Core().read_model(str(out_dir / "openvino_model.xml"))
    except Exception as e:  # noqa: BLE001 - any failure to read the IR is the finding
        return [f"openvino_model.xml: {str(e)[:200]}"]
    manager = Manager()
    manager.register_pass(ConstantFolding())
    manager.run_passes(model)
    problems = []
    for op in model.get_ops():
        if op.get_type_name() == "Constant" and op.get_output_element_type(0).is_real():
            data = op.get_data()
            if bad := int(np.count_nonzero(~np.isfinite(data))):
                problems.append(f"{op.get_friendly_name()} holds {bad} NaN/Inf values of {data.size}")
    return problems


# --- the campaign ----------------------------------------------------------------------------------

VALIDATORS = {"convert": validate_checkpoint, "target": validate_target}


def case_argv(entry: str, rng: random.Random, mutant_path: Path, out_dir: Path, legacy: bool) -> list[str]:
    if entry == "inspect":
        return ["inspect", str(mutant_path)] + (["--json", "-"] if rng.random() < 0.5 else [])
    offset = ["--target-layer-offset", "0"] if legacy and rng.random() < 0.7 else []
    if entry == "convert":
        dtype = ["--dtype", rng.choice(["f16", "f32"])] if rng.random() < 0.2 else []
        return ["convert", str(mutant_path), "-o", str(out_dir), "--quiet", *dtype, *offset]
    if entry == "target":
        form = rng.choices(TARGET_FORMATS, weights=TARGET_FORMAT_WEIGHTS)[0]
        return ["target", str(mutant_path), "-o", str(out_dir), "--quiet", *form]
    return ["check", str(mutant_path), "--reference", str(REFERENCE), *offset]


def entry_seeds(entry: str, seeds: dict) -> list[str]:
    """The names of the seed files an entry point mutates."""
    drafts = [name for name in (*SEEDS, MXFP4_SEED) if name in seeds]
    return sorted(name for name in seeds if name not in drafts) if entry == "target" else sorted(drafts)


def _seed_arch(data: bytes) -> str:
    return next((v for k, t, v in parse(data).kv if k == "general.architecture"), "dflash")


def build_case(entry: str, index: int, seed: int, seeds: dict, map_keys, scratch: Path):
    """`map_keys`: the keys each architecture's map reads ({arch: [key]}, from `_map_keys`)."""
    rng = random.Random(f"{seed}:{entry}:{index}")
    seed_name = rng.choice(entry_seeds(entry, seeds))
    keys = map_keys[_seed_arch(seeds[seed_name])]
    MAP_KEYS[:] = keys
    mutant, operator = mutate(seeds[seed_name], rng, keys)
    path = scratch / "mutant.gguf"
    path.write_bytes(mutant.data)
    out_dir = scratch / "out"
    argv = case_argv(entry, rng, path, out_dir, legacy="legacy" in seed_name)
    return seed_name, mutant, operator, argv, out_dir


def _clear(scratch: Path) -> None:
    for p in scratch.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _warm_up(scratch: Path, seeds: dict, entries) -> None:
    """Import what each command imports, once, before the children are forked. `target` is only
    imported: a run would start OpenVINO's thread pools, which a forked child cannot use."""
    from gguf2ov.cli import main

    seed = scratch / "seed.gguf"
    seed.write_bytes(seeds[SEEDS[0]])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["inspect", str(seed), "--json", "-"])
        main(["convert", str(seed), "-o", str(scratch / "out"), "--quiet"])
        main(["check", str(seed), "--reference", str(REFERENCE)])
    if "target" in entries:
        import nncf  # noqa: F401
        import openvino_tokenizers  # noqa: F401

        import gguf2ov.stages.target  # noqa: F401
        import gguf2ov.targets.graph  # noqa: F401
        import gguf2ov.targets.probe  # noqa: F401
    _clear(scratch)


def load_seeds(entries) -> tuple[dict, dict]:
    """({seed name: bytes}, {arch: the GGUF keys its map reads}) for the entry points: the drafts always
    (the warm-up runs on one), the targets for `target` (the qwen3 one written first, QWEN3_SEED)."""
    seeds = {name: (FIXTURES / name).read_bytes() for name in SEEDS}
    seeds[MXFP4_SEED] = mxfp4_seed()
    if "target" in entries:
        seeds.update({name: path.read_bytes() for name, path in TARGET_SEEDS.items()})
        seeds[QWEN3_SEED] = qwen3_seed()
    map_keys = {arch: _map_keys(arch) for arch in sorted({_seed_arch(data) for data in seeds.values()})}
    return seeds, map_keys


def mxfp4_seed() -> bytes:
    """REFERENCE written in MXFP4 (every weight, as `llama-quantize --pure ... MXFP4_MOE` writes a dense
    draft; the same bytes every time)."""
    from gguf2ov.tools.gguf_writer import write_dflash_gguf

    with tempfile.TemporaryDirectory(prefix="gguf2ov-fuzz-seed-") as tmp:
        path = Path(tmp) / MXFP4_SEED
        write_dflash_gguf(REFERENCE, path, mix="MXFP4_MOE", pure=True)
        return path.read_bytes()


def qwen3_seed() -> bytes:
    """A qwen3 target GGUF (Q4_K_M, with its vocabulary) of the fixture target's checkpoint."""
    from gguf2ov.tools.gguf_writer import write_gguf

    with tempfile.TemporaryDirectory(prefix="gguf2ov-fuzz-seed-") as tmp:
        path = Path(tmp) / QWEN3_SEED
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            write_gguf(FIXTURES / "target-hf", path, "qwen3", tokenizer_dir=FIXTURES / "target-hf", mix="Q4_K_M")
        return path.read_bytes()


def run_fuzz(cases: int, seed: int = 0, entries=ENTRIES, timeout: float = 20.0, memory_mb: int = 1024,
             progress: bool = False, log=None) -> dict:
    """Run `cases` cases per entry point; returns the summary (see `write_summary`)."""
    seeds, map_keys = load_seeds(entries)
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    scratch = Path(tempfile.mkdtemp(prefix="gguf2ov-fuzz-", dir=base))
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        _warm_up(scratch, seeds, entries)
        for entry in entries:
            t0 = time.monotonic()
            for index in range(cases):
                seed_name, mutant, operator, argv, out_dir = build_case(entry, index, seed, seeds, map_keys, scratch)
                code, out, err, seconds, rss = _run_forked(argv, scratch, timeout, memory_mb * 1024 * 1024)
                cls, detail = classify(entry, code, out, err, out_dir, scratch, timeout, seconds)
                outcome = Outcome(entry, index, seed_name, operator, mutant.description, argv, cls, code,
                                  round(seconds, 3), round(rss, 1), detail)
                outcomes.append(outcome)
                if log is not None and cls not in ("clean", "clean_error"):
                    log.write(json.dumps(outcome.__dict__) + "\n")
                    log.flush()
                _clear(scratch)
                if progress and (index + 1) % (50 if entry == "target" else 500) == 0:
                    print(f"{entry}: {index + 1}/{cases} ({time.monotonic() - t0:.0f} s) "
                          f"{dict(Counter(o.cls for o in outcomes if o.entry == entry))}", file=sys.stderr,
                          flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(outcomes, cases, seed, entries, timeout, memory_mb, time.monotonic() - started)


def summarise(outcomes, cases, seed, entries, timeout, memory_mb, seconds) -> dict:
    counts = {e: {c: 0 for c in CLASSES} for e in entries}
    by_operator = defaultdict(Counter)
    examples = defaultdict(list)
    times = defaultdict(float)
    peak = defaultdict(float)
    for o in outcomes:
        counts[o.entry][o.cls] += 1
        by_operator[o.operator][o.cls] += 1
        times[o.entry] += o.seconds
        peak[o.entry] = max(peak[o.entry], o.peak_rss_mb)
        if o.cls not in ("clean", "clean_error") and len(examples[o.cls]) < EXAMPLES_PER_CLASS:
            examples[o.cls].append(o.__dict__)
    return {
        "seed": seed, "cases_per_entry": cases, "timeout_s": timeout, "memory_limit_mb": memory_mb,
        "seconds": round(seconds, 1), "seconds_per_entry": {e: round(times[e], 1) for e in entries},
        "peak_rss_mb_per_entry": {e: peak[e] for e in entries},
        "counts": counts, "by_operator": {op: dict(c) for op, c in sorted(by_operator.items())},
        "examples": dict(examples),
        "failures": sum(counts[e][c] for e in entries for c in CLASSES if c not in ("clean", "clean_error")),
    }


def write_summary(summary: dict, name: str, out_dir: Path = RESULTS) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"fuzz-{name}.json", out_dir / f"fuzz-{name}.md"
    json_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(summary), encoding="utf-8")
    return json_path, md_path


def markdown(summary: dict) -> str:
    entries = list(summary["counts"])
    lines = [f"# GGUF fuzzing: {summary['cases_per_entry']} cases per entry point (seed {summary['seed']})", "",
             f"Timeout {summary['timeout_s']:.0f} s per case, address space limit {summary['memory_limit_mb']} MiB "
             f"above the child's size at fork; {summary['seconds']:.0f} s in all.", "",
             "| entry point | " + " | ".join(CLASSES) + " | time (s) | peak RSS (MiB) |",
             "|---" * (len(CLASSES) + 3) + "|"]
    for e in entries:
        c = summary["counts"][e]
        lines.append(f"| {e} | " + " | ".join(str(c[k]) for k in CLASSES) +
                     f" | {summary['seconds_per_entry'][e]:.0f} | {summary['peak_rss_mb_per_entry'][e]:.0f} |")
    lines += ["", "## By mutation (first operator of a case)", "",
              "| mutation | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    for op, c in summary["by_operator"].items():
        lines.append(f"| {op} | " + " | ".join(str(c.get(k, 0)) for k in CLASSES) + " |")
    if summary["examples"]:
        lines += ["", "## Examples", ""]
        for cls, items in summary["examples"].items():
            for o in items:
                lines.append(f"- {cls}: {o['entry']}:{o['index']} ({o['seed_file']}) {o['mutation']} -> "
                             f"{o['detail']}".replace("|", "\\|"))
    return "\n".join(lines) + "\n"


def replay(spec: str, seed: int) -> int:
    entry, index = spec.split(":")
    seeds, map_keys = load_seeds((entry,))
    scratch = Path(tempfile.mkdtemp(prefix="gguf2ov-replay-"))
    seed_name, mutant, operator, argv, out_dir = build_case(entry, int(index), seed, seeds, map_keys, scratch)
    print(f"seed file {seed_name}; {mutant.description}\nmutant: {scratch / 'mutant.gguf'}\n"
          f"gguf2ov {' '.join(argv)}", file=sys.stderr)
    from gguf2ov.cli import main

    return main(["--debug", *argv])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Mutation fuzzer for gguf2ov inspect/convert/check/target.")
    parser.add_argument("--cases", type=int, default=1000, help="cases per entry point")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entry", action="append", choices=ENTRIES, help="entry point(s) (default: all four)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--memory-mb", type=int, default=1024, help="address space a case may add")
    parser.add_argument("--name", help="results name (default: <cases>-seed<seed>)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--replay", metavar="ENTRY:INDEX", help="rebuild one case and run it with --debug")
    args = parser.parse_args(argv)
    if args.replay:
        return replay(args.replay, args.seed)
    name = args.name or f"{args.cases}-seed{args.seed}"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"fuzz-{name}.failures.jsonl", "w", encoding="utf-8") as log:
        summary = run_fuzz(args.cases, args.seed, tuple(args.entry or ENTRIES), args.timeout, args.memory_mb,
                           progress=True, log=log)
    json_path, md_path = write_summary(summary, name, args.out)
    print(markdown(summary))
    print(f"written: {json_path}, {md_path}", file=sys.stderr)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
