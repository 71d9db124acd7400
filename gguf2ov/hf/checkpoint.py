"""Hugging Face checkpoint folders as gguf2ov reads them: config.json and safetensors files.

One reading of a folder for every stage, so that `check`, `export` and the GGUF writer cannot
disagree about which weights a folder holds. Only safetensors are read: nothing is unpickled.
"""

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..names import CONFIG_FILE, PROVENANCE_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX


def read_json_object(path, required: bool = True) -> dict | None:
    """A JSON file that must hold an object (config.json, an index); None when absent and optional."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise Gguf2ovError(f"{path} does not exist")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Gguf2ovError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise Gguf2ovError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def safetensors_files(folder) -> list[Path]:
    """The weight files of a checkpoint: the shards its index names, else model.safetensors.

    The index wins when both exist, as in transformers.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise Gguf2ovError(f"{folder} is not a checkpoint folder",
                           hint="pass a folder with config.json and model.safetensors (or a sharded index)")
    index = read_json_object(folder / SAFETENSORS_INDEX, required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Gguf2ovError(f"{folder / SAFETENSORS_INDEX} has no weight_map: not a safetensors index")
        files = [folder / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise Gguf2ovError(f"{folder / SAFETENSORS_INDEX} names shards that are not there: {', '.join(missing[:4])}")
        return files
    if (folder / SAFETENSORS_FILE).is_file():
        return [folder / SAFETENSORS_FILE]
    raise Gguf2ovError(f"no {SAFETENSORS_FILE} in {folder}", hint="only safetensors checkpoints are read (never pickles)")


# safetensors dtype -> the NumPy dtype its bytes are read as (BF16 as its bit patterns: NumPy has no
# bfloat16). Floating tensors are handed out as float32, integer ones as stored.
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}
_FLOATS = ("F64", "F32", "F16", "BF16")
_MAX_HEADER = 100 << 20  # the safetensors library's own limit


@dataclass(frozen=True)
class _Entry:
    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # of the tensor's first byte in the file


def _read_header(file: Path, size: int) -> dict[str, _Entry]:
    """The tensors a safetensors file holds, from its header (8-byte length, JSON), checked against its size."""
    def bad(why):
        return Gguf2ovError(f"{file}: not a readable safetensors file ({why})")

    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad("shorter than its header")
        n = struct.unpack("<Q", head)[0]
        if n > min(_MAX_HEADER, size - 8):
            raise bad(f"header of {n} bytes in a file of {size}")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    entries, data_start = {}, 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise bad(f"tensor {name!r} has no dtype, shape and data_offsets") from e
        if dtype not in _DTYPES:
            raise Gguf2ovError(f"{file}: tensor {name!r} is {dtype}, which this tool does not read",
                               hint=f"supported: {', '.join(_DTYPES)}")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
                and end - begin == expected and data_start + end <= size and min(shape, default=0) >= 0):
            raise bad(f"tensor {name!r}: offsets {[begin, end]} do not hold {dtype} {list(shape)}")
        entries[name] = _Entry(file.name, dtype, shape, data_start + begin)
    return entries


def _as_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A new array of the stored values: float32 for floating tensors, else the stored integer type."""
    if dtype == "BF16":  # the upper half of a float32's bits: exact
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype in _FLOATS:
        return raw.astype(np.float32)
    return raw.astype(raw.dtype.newbyteorder("="))


class Checkpoint:
    """A Hugging Face checkpoint folder read lazily: shapes from the headers, one tensor at a time.

    The files are memory-mapped and read with NumPy (no framework): a tensor's pages are read when
    it is loaded, and `load_rows` reads only the rows it asks for.
    """

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise Gguf2ovError(f"{self.path}: not a checkpoint folder",
                               hint="pass a folder with config.json and model.safetensors (or a sharded index)")
        files = safetensors_files(self.path)
        index = read_json_object(self.path / SAFETENSORS_INDEX, required=False)
        weight_map = index["weight_map"] if index else None
        self._maps: dict[str, mmap.mmap] = {}
        self._entries: dict[str, _Entry] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            size = file.stat().st_size
            entries = _read_header(file, size)
            with open(file, "rb") as f:
                self._maps[file.name] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            for key, entry in entries.items():
                if weight_map is None or weight_map.get(key) == file.name:
                    self._entries[key] = entry
                    self.shapes[key] = entry.shape
        self.config = read_json_object(self.path / CONFIG_FILE, required=False)

    def _stored(self, name: str) -> np.ndarray:
        """The tensor as stored (a read-only view of the mapped file, nothing read yet)."""
        e = self._entries[name]
        count = int(np.prod(e.shape, dtype=np.int64))
        return np.frombuffer(self._maps[e.file], dtype=_DTYPES[e.dtype], count=count, offset=e.offset).reshape(e.shape)

    def dtype(self, name: str) -> str:
        """The safetensors dtype the tensor is stored in (BF16, F16, F32, I64...)."""
        return self._entries[name].dtype

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 (integer tensors as stored), in a new array."""
        return _as_float32(self._stored(name), self._entries[name].dtype)

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop (along the first axis) as float32: only those rows are read."""
        return _as_float32(self._stored(name)[start:stop], self._entries[name].dtype)

    def provenance(self) -> dict:
        """What the converter recorded in gguf2ov.json (empty for a checkpoint it did not write)."""
        try:
            return read_json_object(self.path / PROVENANCE_FILE, required=False) or {}
        except Gguf2ovError:  # a damaged record only costs the quant-type column
            return {}

    def recorded_qtypes(self) -> dict[str, str]:
        """{hf_name: GGUF quant type}, when the converter recorded them (`qtypes`, at the top of
        gguf2ov.json or in its options)."""
        record = self.provenance()
        found = record.get("qtypes") or (record.get("options") or {}).get("qtypes")
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


class RenamedCheckpoint:
    """A checkpoint's tensors under other names ({name: the stored name}), the others left out: a
    folder whose model is saved under a prefix, or holds more than one model (a VLM's vision tower)."""

    def __init__(self, checkpoint: Checkpoint, names: dict[str, str]):
        self.path, self.config = checkpoint.path, checkpoint.config
        self._checkpoint, self._names = checkpoint, dict(names)
        self.shapes = {name: checkpoint.shapes[stored] for name, stored in self._names.items()}

    def dtype(self, name: str) -> str:
        return self._checkpoint.dtype(self._names[name])

    def load(self, name: str) -> np.ndarray:
        return self._checkpoint.load(self._names[name])

    def load_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self._checkpoint.load_rows(self._names[name], start, stop)
