"""Write a Hugging Face checkpoint folder: config.json, safetensors shards, gguf2ov.json.

Tensors are streamed one at a time into safetensors files written here directly (8-byte header
length, JSON header, raw data), so peak memory stays near the largest tensor. The header goes
first, so every name, dtype and shape is fixed from the plan before any data is read. Shards and
`model.safetensors.index.json` follow transformers' layout; the folder appears only when complete.
Every value is checked as it is written: a NaN or Inf (a broken GGUF tensor, or a value beyond the
F16 range) fails the write, naming the tensor, unless the caller allows them; then they are counted.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..finite import count_nonfinite, nonfinite_error
from ..names import CONFIG_FILE, PROVENANCE_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX
from ..outputs import atomic_dir, writing
from ..progress import progress as progress_bar

# --dtype -> (safetensors dtype, bytes per element)
DTYPES = {"bf16": ("BF16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}
INT_DTYPES = {np.dtype(np.int8): "I8", np.dtype(np.int16): "I16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # transformers' default "5GB"
ENCODE_CHUNK = 1 << 22  # elements


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str                # safetensors dtype: BF16, F16, F32, I64...
    source: str = ""          # where the values come from, for messages (GGUF name and type)

    @property
    def n_bytes(self) -> int:
        size = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "I16": 2, "I32": 4, "I64": 8}[self.dtype]
        return int(np.prod(self.shape, dtype=np.int64)) * size


@dataclass(frozen=True)
class WriteResult:
    out_dir: str
    files: list[str]
    n_tensors: int
    n_bytes: int
    nonfinite: dict[str, int]  # tensor -> NaN/Inf values written (only with allow_nonfinite)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # keep NaNs NaN (rounding could carry them into inf); torch makes them quiet
        rounded[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return to_bf16_bits(x)
    if dtype == "F16":
        with np.errstate(over="ignore"):  # values beyond the f16 range become Inf: the writer counts them
            return np.ascontiguousarray(x, dtype=np.float16)
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    return np.ascontiguousarray(x)  # integer tensors keep their type


def shard_specs(specs: list[TensorSpec], max_shard_size: int) -> list[list[TensorSpec]]:
    """Split like huggingface_hub: start a new shard when the next tensor would overflow this one."""
    shards, size = [[]], 0
    for spec in specs:
        if shards[-1] and size + spec.n_bytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.n_bytes
    return shards


def safetensors_header(specs: list[TensorSpec]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for spec in specs:
        end = offset + spec.n_bytes
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned, as the safetensors library does
    return struct.pack("<Q", len(raw)) + raw


# config.json, gguf2ov.json and the index beside the safetensors
SMALL_FILES_BYTES = 16_000


def checkpoint_bytes(specs: list[TensorSpec], max_shard_size: int = DEFAULT_MAX_SHARD_SIZE) -> int:
    """The bytes `write_checkpoint` writes for `specs`: the tensors, each shard's header and the small files."""
    return sum(s.n_bytes for s in specs) + sum(len(safetensors_header(shard)) for shard in
                                               shard_specs(specs, max_shard_size)) + SMALL_FILES_BYTES


def write_checkpoint(out_dir, config: dict, specs: list[TensorSpec], tensors, *, provenance: dict | None = None,
                     max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, overwrite: bool = False,
                     progress: bool = True, allow_nonfinite: bool = False, before_commit=None) -> WriteResult:
    """Write `tensors` (an iterable of (name, array) in the order of `specs`) as a checkpoint.

    `before_commit(result)` runs once every file is written, before the folder is renamed into
    place: if it fails (a report that cannot be written), nothing is left in place.
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise Gguf2ovError(f"tensor names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    shards = shard_specs(specs, max_shard_size)
    files = [SAFETENSORS_FILE] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    items = iter(progress_bar(tensors, desc="writing", total=len(specs), enabled=progress, unit="tensor"))
    extra = [SAFETENSORS_INDEX] if len(shards) > 1 else []
    nonfinite = {}
    result = WriteResult(str(out_dir), [CONFIG_FILE, *files, *extra] + ([PROVENANCE_FILE] if provenance else []),
                         len(specs), sum(s.n_bytes for s in specs), nonfinite)
    commit = (lambda tmp: before_commit(result)) if before_commit else None
    with atomic_dir(out_dir, overwrite=overwrite, before_commit=commit) as tmp:
        for file_name, shard in zip(files, shards):
            with writing(tmp / file_name), open(tmp / file_name, "wb") as f:  # a failed write() names no file
                f.write(safetensors_header(shard))
                for spec in shard:
                    if bad := _write_tensor(f, spec, next(items, None)):
                        if not allow_nonfinite:
                            raise _nonfinite_error(spec, *bad)
                        nonfinite[spec.name] = bad[0]
        if len(shards) > 1:
            weight_map = {s.name: file_name for file_name, shard in zip(files, shards) for s in shard}
            index = {"metadata": {"total_size": sum(s.n_bytes for s in specs)}, "weight_map": weight_map}
            _write_json(tmp / SAFETENSORS_INDEX, index)
        _write_json(tmp / CONFIG_FILE, config)
        if provenance is not None:
            _write_json(tmp / PROVENANCE_FILE, provenance)
    return result


def _nonfinite_error(spec: TensorSpec, written: int, stored: int) -> Gguf2ovError:
    where = f"{spec.name} (from {spec.source})" if spec.source else spec.name
    total = int(np.prod(spec.shape, dtype=np.int64))
    if stored:
        return nonfinite_error(where, stored, total)
    return nonfinite_error(where, written, total, too_large_for=spec.dtype, hint="convert with --dtype bf16 or f32")


def _write_tensor(f, spec: TensorSpec, item) -> tuple[int, int] | None:
    """Write one tensor; (NaN/Inf values written, of them NaN/Inf already in the input) if any."""
    # A mismatch here is a bug in the caller (the plan fixed names and shapes), not user input.
    if item is None or item[0] != spec.name or tuple(item[1].shape) != tuple(spec.shape):
        got = None if item is None else (item[0], tuple(item[1].shape))
        raise RuntimeError(f"tensor stream out of step with the header: expected {spec.name} {spec.shape}, got {got}")
    # Encoded in slices, so that the bf16 rounding's temporaries stay small next to the tensor.
    flat = np.ascontiguousarray(item[1]).reshape(-1)
    written = stored = 0
    for start in range(0, flat.size, ENCODE_CHUNK):
        chunk = flat[start:start + ENCODE_CHUNK]
        encoded = encode(chunk, spec.dtype)
        if bad := _count_nonfinite(encoded, spec.dtype):
            written += bad
            stored += count_nonfinite(chunk)
        f.write(memoryview(encoded).cast("B"))
    return (written, stored) if written else None


def _count_nonfinite(encoded: np.ndarray, dtype: str) -> int:
    if dtype == "BF16":  # bit patterns: exponent all ones is Inf or NaN
        return int(np.count_nonzero((encoded & np.uint16(0x7F80)) == np.uint16(0x7F80)))
    return count_nonfinite(encoded)  # F16, F32; 0 for integer tensors


def _write_json(path: Path, obj) -> None:
    with writing(path):
        path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
