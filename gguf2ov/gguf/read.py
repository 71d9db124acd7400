"""Open a GGUF file: metadata as plain values, tensor infos in PyTorch order, lazy tensor views.

The header is parsed here rather than by `gguf.GGUFReader`, for two reasons:
- a GGUF is untrusted input: every length (strings, arrays, counts, tensor data) is checked
  against the file size before anything is allocated or looped over, so a corrupt or truncated
  file gives one `Gguf2ovError` naming the file (and tensor), never a traceback or a loop over a
  garbage array length;
- gguf-py builds two numpy views per string of a metadata array: opening the Gemma 3 270M GGUF
  (262k-token vocabulary) took 24 s with `GGUFReader` on 2 busy cores, 0.5 s with this parser.
  `tests/gguf/test_read.py` checks that both read the same metadata, offsets and tensor views.
Tensor data is memory-mapped (`np.memmap`), with the same views gguf-py gives (typed arrays in
PyTorch order; bytes in the last axis for quantized types); nothing is read until `load`.
Metadata arrays of more than `COMPACT_ARRAY` items (a tokenizer's tokens, scores, types and merges)
stay compact: numbers as a read-only numpy array, strings as a `StringArray` over their encoded
bytes. As Python lists they cost 4x (a vocabulary of short tokens) to 18x (16-bit integers) their
size in the file, an object and a pointer per item; compact, about 1.1x
(`benchmarks/bench_metadata.py`).
Layout: magic, version, tensor count, kv count, kv pairs, tensor infos, padding to
`general.alignment`, tensor data. Only little-endian files (what llama.cpp writes) are read.

The file is held to llama.cpp's own rules (ggml/src/gguf.cpp, gguf_init_from_file_impl, and the
typed reads of llama-model-loader.cpp), so that a file gguf2ov builds from is one llama.cpp runs:
- the keys the reader itself interprets have the value type llama.cpp reads them as (`KEY_TYPES`):
  general.alignment UINT32 (gguf-py's reader requires it too), a power of two (1, 2 and 4 are
  valid: llama.cpp and gguf-py accept any non-zero power of two);
- the tensors' data lie in the order of their infos, each at the previous one's end rounded up to
  the alignment, the first at 0: a tensor whose offset points elsewhere (into another tensor's
  data) is refused, as llama.cpp refuses it.
"""

import array
import mmap
import operator
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import Gguf2ovError
from ..provenance import opened_record, sha256_file, source_record
from .hub import HubFile

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32

# Fixed-size metadata value types -> numpy dtype (little-endian).
_SCALARS = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8", GGUFValueType.BOOL: "?",
}
# GGML types whose data gguf-py exposes as typed elements rather than bytes.
_ELEMENT_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64,
}
_U64 = struct.Struct("<Q")
# The keys this module reads itself, with the value type llama.cpp requires of them: gguf.cpp refuses
# a general.alignment of another type than UINT32; llama-model-loader.cpp reads general.architecture
# as a string and split.count and split.no as uint16, and its typed get_key refuses any other type.
# (The keys a map reads are typed by its config rules, maps/rules.py VALUE_TYPES.)
KEY_TYPES = {"general.alignment": GGUFValueType.UINT32, "general.architecture": GGUFValueType.STRING,
             "split.count": GGUFValueType.UINT16, "split.no": GGUFValueType.UINT16}
# Metadata arrays longer than this stay compact (see the module docstring); shorter ones, such as
# layer ids, are plain lists.
COMPACT_ARRAY = 64
MAX_DUPLICATE_VALUES = 4  # values of a repeated key that a warning shows
_INTEGER_TYPES = {GGMLQuantizationType.I8, GGMLQuantizationType.I16, GGMLQuantizationType.I32,
                  GGMLQuantizationType.I64}


@dataclass(frozen=True)
class TensorInfo:
    gguf_name: str
    qtype: GGMLQuantizationType
    ne: tuple[int, ...]      # as stored: ne[0] is the contiguous axis
    shape: tuple[int, ...]   # PyTorch order: reversed ne
    n_elements: int
    n_bytes: int
    offset: int              # absolute byte offset of the data in the file

    @property
    def type_name(self) -> str:
        return self.qtype.name


class GgufFile:
    """A parsed GGUF: `metadata`, `tensors` (by GGUF name), `raw(name)` and `load(name)`."""

    def __init__(self, path: Path, version: int, metadata: dict, tensors: dict[str, TensorInfo],
                 duplicate_keys: dict[str, list] | None = None):
        self.path = path
        self.origin: HubFile | None = None  # where the file came from, when it came from the hub
        self.version = version
        self.metadata = metadata  # a key stated more than once holds its first value
        self.tensors = tensors
        # key -> every value the file states for it, for the keys it states more than once (only a
        # file opened with duplicate_keys=True has any)
        self.duplicate_keys = duplicate_keys or {}

    @property
    def arch(self) -> str | None:
        return self.metadata.get("general.architecture")

    @cached_property
    def file_bytes(self) -> int:
        return self.path.stat().st_size

    @cached_property
    def sha256(self) -> str:
        """Hashed once per opened file, however many outputs record it."""
        return sha256_file(self.path)

    @cached_property
    def _mm(self) -> np.memmap:
        return np.memmap(self.path, mode="r")

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise Gguf2ovError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The stored data as a memory-mapped view, shaped like gguf-py's `ReaderTensor.data`:
        PyTorch order, and for quantized types the last axis in bytes."""
        info = self.info(name)
        data = self._mm[info.offset:info.offset + info.n_bytes]
        dtype = _ELEMENT_DTYPES.get(info.qtype)
        if dtype is not None:
            return data.view(dtype).reshape(info.shape)
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        return data.reshape(*info.shape[:-1], info.shape[-1] // block * type_size)

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch shape (integer tensors keep their integer type)."""
        from ..work import count
        from .quants import dequantize

        info = self.info(name)
        count("GGUF tensors dequantized")
        if info.qtype in _INTEGER_TYPES:
            return np.array(self.raw(name))
        try:
            values = dequantize(self.raw(name), info.qtype)
        except Gguf2ovError as e:
            raise Gguf2ovError(f"{self.path}: tensor {_clip(name)}: {e.message}", hint=e.hint) from e
        return np.asarray(values, dtype=np.float32).reshape(info.shape)

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop (along the first PyTorch axis) as float32: only their blocks are read.
        A block never spans two rows (quantization runs along ne[0])."""
        from .quants import dequantize

        info = self.info(name)
        if info.qtype in _INTEGER_TYPES or len(info.shape) < 2:
            return self.load(name)[start:stop]
        rows = self.raw(name)[start:stop]
        try:
            values = dequantize(rows, info.qtype)
        except Gguf2ovError as e:
            raise Gguf2ovError(f"{self.path}: tensor {_clip(name)}: {e.message}", hint=e.hint) from e
        return np.asarray(values, dtype=np.float32).reshape(rows.shape[0], *info.shape[1:])


@source_record.register
def _gguf_record(source: GgufFile) -> dict:
    return opened_record(source.path, source.sha256, source.origin)


def is_gguf_file(path) -> bool:
    """Whether `path` is a regular file that starts with the GGUF magic (a folder, a missing path: no)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path, duplicate_keys: bool = False) -> GgufFile:
    """Open a GGUF file; `path` may be a `hub.HubFile`, which the opened file keeps as its `origin`.

    A metadata key stated twice is refused, as llama.cpp's loader and gguf-py's reader refuse it:
    which value is meant cannot be told. `duplicate_keys=True` opens such a file anyway (for
    `inspect`, which shows it and warns): the first value is kept and `GgufFile.duplicate_keys`
    lists every value of each repeated key."""
    gguf = _open_gguf(Path(path))
    gguf.origin = path if isinstance(path, HubFile) else None
    if gguf.duplicate_keys and not duplicate_keys:
        key, values = next(iter(gguf.duplicate_keys.items()))
        more = f" (and {len(gguf.duplicate_keys) - 1} more keys)" if len(gguf.duplicate_keys) > 1 else ""
        raise Gguf2ovError(f"{gguf.path}: metadata key {_clip(key)} appears {len(values)} times{more}; llama.cpp and "
                           "gguf-py refuse such a file", hint="`gguf2ov inspect` shows its values; re-convert the file")
    return gguf


def duplicate_key_warnings(gguf: GgufFile) -> list[str]:
    """One line per metadata key the file states more than once, with its values."""
    lines = []
    for key, values in gguf.duplicate_keys.items():
        shown = ", ".join(summarise(v, max_chars=40) for v in values[:MAX_DUPLICATE_VALUES])
        rest = f", ... ({len(values)} values)" if len(values) > MAX_DUPLICATE_VALUES else ""
        lines.append(f"metadata key {_clip(key)} appears {len(values)} times ({shown}{rest}); shown: the first. "
                     "llama.cpp and gguf-py refuse such a file, as every other gguf2ov command does")
    return lines


def _open_gguf(path: Path) -> GgufFile:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise Gguf2ovError(f"{path}: no such file") from None
    except OSError as e:  # a symlink loop, a name too long, a folder on the way that cannot be searched
        raise Gguf2ovError(f"{path}: cannot open: {e.strerror or e}", hint="check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise Gguf2ovError(f"{path}: is a directory, not a GGUF file", hint="pass the .gguf file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise Gguf2ovError(f"{path}: not a regular file (a FIFO, socket or device); a GGUF is read by memory map",
                           hint="save the GGUF to a file first")
    size = st.st_size
    if size < 24:
        raise Gguf2ovError(f"{path}: not a GGUF file (only {size} bytes)")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise Gguf2ovError(f"{path}: cannot open: {e.strerror or e}", hint="check the file's permissions") from None
    with f:
        if (magic := f.read(4)) != GGUF_MAGIC:
            raise Gguf2ovError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                gguf = _parse(_Cursor(buf, size), path)
            except _Corrupt as e:
                raise Gguf2ovError(f"{path}: corrupt or truncated GGUF: {e}",
                                   hint="re-download the file or check that it was fully written") from None
    _require_whole_model(gguf)
    return gguf


def _require_whole_model(gguf: GgufFile) -> None:
    """Refuse one part of a split GGUF (llama.cpp's gguf-split writes `split.count` into every part):
    read alone, a part lacks the other parts' tensors, and every later message would be about those."""
    count, no = gguf.get("split.count"), gguf.get("split.no")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 1:
        return
    which = f"part {no + 1} of {count}" if isinstance(no, int) and 0 <= no < count else f"one of {count} parts"
    raise Gguf2ovError(f"{gguf.path}: {which} of a split GGUF; gguf2ov reads a model from one file",
                       hint=f"merge the parts with llama.cpp: `llama-gguf-split --merge PART1 merged.gguf` (PART1: "
                            f"the -00001-of-{count:05d} file, the others beside it), then pass merged.gguf")


class StringArray(Sequence):
    """A GGUF string array kept as its encoded bytes; an item is decoded when it is read.

    `data` holds the array as stored (each string after its 8-byte length), `starts` where each
    string's bytes begin; every string was checked to be UTF-8 when the file was parsed.
    """

    __slots__ = ("_data", "_starts")

    def __init__(self, data: bytes, starts: np.ndarray):
        self._data, self._starts = data, starts

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("StringArray index out of range")
        start = int(self._starts[i])
        (n,) = _U64.unpack_from(self._data, start - 8)
        return self._data[start:start + n].decode("utf-8")

    def __eq__(self, other):
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"

    @property
    def nbytes(self) -> int:
        return len(self._data) + self._starts.nbytes


def summarise(value, max_items: int = 4, max_chars: int = 80) -> str:
    """A short text for a metadata value; long arrays become `[262144 x str] first: ...`."""
    if isinstance(value, (list, np.ndarray, StringArray)):
        head = value[:max_items + 1]
        head = head.tolist() if isinstance(head, np.ndarray) else list(head)
        if len(value) <= max_items and len(repr(head)) <= max_chars:
            return repr(head)
        kind = type(head[0]).__name__ if head else "?"
        first = ", ".join(repr(v)[:40] for v in head[:3])
        return f"[{len(value)} x {kind}] first: {first}, ..."
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


# --- parser: every length is checked against the file before it is used -------------------------

class _Corrupt(Exception):
    pass


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Corrupt(f"{what} at byte {self.pos} needs {n} bytes but the file ends at {self.size}")

    def scalars(self, dtype: str, count: int, what: str) -> np.ndarray:
        n = np.dtype(dtype).itemsize * count
        self.need(n, what)
        if dtype == "?":  # any non-zero byte is true; numpy would keep the byte as it is
            values = np.frombuffer(self.buf, dtype="<u1", count=count, offset=self.pos) != 0
        else:
            values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += n
        return values

    def _unpack(self, fmt: str, n: int, what: str) -> int:
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self._unpack("<I", 4, what)

    def u64(self, what: str) -> int:
        return self._unpack("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"{what} is not valid UTF-8") from None

    def strings(self, count: int, what: str) -> StringArray:
        """`count` strings as one StringArray (each checked like `string`)."""
        first, buf, size = self.pos, self.buf, self.size
        starts = array.array("q")
        pos = first
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            (n,) = _U64.unpack_from(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, what)
            try:
                str(buf[pos:pos + n], "utf-8")  # checked, then dropped
            except UnicodeDecodeError:
                raise _Corrupt(f"{what} is not valid UTF-8") from None
            starts.append(pos - first)
            pos += n
        self.pos = pos
        data = buf[first:pos]
        starts = np.frombuffer(starts, dtype=np.int64)
        return StringArray(data, starts.astype(np.uint32) if len(data) < 2**32 else starts)

    def value(self, vtype: int, what: str, in_array: bool = False):
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype in _SCALARS:
            return _plain(self.scalars(_SCALARS[vtype], 1, what)[0], vtype)
        if vtype == GGUFValueType.ARRAY and not in_array:
            itype, count = self.u32(what), self.u64(what)
            if itype in _SCALARS:
                # Arrays stay exact (float32 -> float64 in a list), without the per-value rounding
                # of scalars below: a 262k-entry score table would take seconds.
                values = self.scalars(_SCALARS[itype], count, what)
                if count <= COMPACT_ARRAY:
                    return values.tolist()
                values.flags.writeable = False
                return values
            if itype == GGUFValueType.STRING:
                self.need(count * 8, f"{what} ({count} strings)")  # each string has an 8-byte length
                if count <= COMPACT_ARRAY:
                    return [self.string(what) for _ in range(count)]
                return self.strings(count, what)
            raise _Corrupt(f"{what} is an array of unsupported value type {itype}")
        raise _Corrupt(f"{what} has unknown value type {vtype}")


def _plain(value, vtype):
    if vtype == GGUFValueType.FLOAT32:
        # float32 1e-6 read as a python float is 9.99999997e-07: keep the shortest decimal that
        # names the same float32, which is what the converted config held.
        return float(str(value))
    if vtype == GGUFValueType.BOOL:
        return bool(value)
    return value.item()


def _parse(cur: _Cursor, path: Path) -> GgufFile:
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise Gguf2ovError(f"{path}: GGUF version {version} is not supported (supported: {SUPPORTED_VERSIONS})",
                           hint="big-endian files and GGUF v1 are not handled")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    # Each metadata entry takes at least 13 bytes and each tensor info at least 28: a count that
    # cannot fit in the file is garbage, not something to loop over.
    cur.need(n_kv * 13 + n_tensors * 28, f"{n_kv} metadata entries and {n_tensors} tensor infos")
    metadata, duplicates = {}, {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        shown = _clip(key)  # a corrupt length can make a key of megabytes
        vtype = cur.u32(f"type of {shown}")
        value = cur.value(vtype, f"metadata {shown}")
        if key in KEY_TYPES and vtype != KEY_TYPES[key]:
            raise _Corrupt(f"{key} is {summarise(value, max_chars=60)} ({_type_name(vtype)}), not "
                           f"{_type_words(KEY_TYPES[key])}: llama.cpp refuses any other type")
        if key in metadata:  # read like any other value, then kept aside: open_gguf decides
            duplicates.setdefault(key, [metadata[key]]).append(value)
        else:
            metadata[key] = value
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment {alignment} is not a power of two")
    infos = []
    for i in range(n_tensors):
        name = cur.string(f"name of tensor #{i}")
        shown = _clip(name)
        n_dims = cur.u32(f"dimension count of tensor {shown}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Corrupt(f"tensor {shown} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
        ne = tuple(int(d) for d in cur.scalars("<u8", n_dims, f"shape of tensor {shown}"))
        infos.append((name, ne, cur.u32(f"type of tensor {shown}"), cur.u64(f"offset of tensor {shown}")))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    expected = 0  # where llama.cpp expects the next tensor's data: the previous one's end, aligned
    for name, ne, raw_type, offset in infos:
        if name in tensors:
            raise _Corrupt(f"tensor {_clip(name)} appears twice")
        info = _tensor_info(name, ne, raw_type, data_start + offset, cur.size)
        if offset != expected:
            raise _Corrupt(f"tensor {_clip(name)} has its data at offset {offset}, where llama.cpp expects {expected} "
                           f"(the previous tensor's end, aligned to {alignment}): it would read other data")
        tensors[name] = info
        expected = -(-(offset + info.n_bytes) // alignment) * alignment
    return GgufFile(path, version, metadata, tensors, duplicates)


def _type_name(vtype: int) -> str:
    try:
        return GGUFValueType(vtype).name
    except ValueError:
        return f"type {vtype}"


def _type_words(vtype: GGUFValueType) -> str:
    return "a string" if vtype == GGUFValueType.STRING else f"a {vtype.name}"


def _clip(text: str, limit: int = 120) -> str:
    """A name from the file, short enough for a message."""
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text)} chars)"


def _tensor_info(name, ne, raw_type, offset, file_size) -> TensorInfo:
    shown = _clip(name)
    try:
        qtype = GGMLQuantizationType(raw_type)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise _Corrupt(f"tensor {shown} has unknown GGML type {raw_type}") from None
    # A dimension of 0 makes the element count 0, so the size check below would pass for any other
    # dimension (e.g. [0, 2^63]) and numpy would fail later: GGUF tensors are never empty.
    if 0 in ne:
        raise _Corrupt(f"tensor {shown} has a dimension of 0 (ne {list(ne)})")
    if ne[0] % block:
        raise _Corrupt(f"tensor {shown} has ne[0]={ne[0]}, not a multiple of the {qtype.name} block size {block}")
    n_elements = 1
    for d in ne:
        n_elements *= d  # python ints: no overflow on absurd shapes
    n_bytes = n_elements // block * type_size
    # every dimension is at most the element count, which the byte count bounds by the file size
    if offset + n_bytes > file_size:
        raise _Corrupt(f"tensor {shown} ({qtype.name}, ne {list(ne)}) needs bytes {offset}..{offset + n_bytes} "
                       f"but the file has {file_size}")
    return TensorInfo(name, qtype, ne, tuple(reversed(ne)), n_elements, n_bytes, offset)
