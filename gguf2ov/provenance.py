"""What produced an output: package versions, source hashes, options. Stored in every output."""

import hashlib
import os
import platform
import sys
from datetime import datetime, timezone
from functools import singledispatch
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "gguf2ov", "gguf", "numpy", "torch", "safetensors", "transformers", "optimum", "optimum-intel",
    "openvino", "openvino-genai", "openvino-tokenizers", "nncf",
)


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_path(path) -> str:
    """Hash of a file, or of a folder's files (names and contents, in sorted order)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"cannot hash {path}: it does not exist")
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def provenance(sources: dict | None = None, options: dict | None = None) -> dict:
    """The record; each source as `source_record` records its type."""
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "sources": {k: source_record(v) for k, v in (sources or {}).items()},
        "options": options or {},
    }


def target_record(path) -> dict:
    """A target folder as a report records it: the hash of its IR's graph (.xml) and the size of its
    weights (.bin). Hashing the weights would read a multi-GB target end to end for one line."""
    from .names import IR_XML, VLM_LANGUAGE_MODEL

    path = Path(path)
    xml = next((path / n for n in (IR_XML, VLM_LANGUAGE_MODEL) if (path / n).is_file()), None)
    if xml is None:
        return {"path": str(path), "sha256": None}
    return {"path": str(path), "ir_xml_sha256": sha256_file(xml), "ir_bin_bytes": xml.with_suffix(".bin").stat().st_size
            if xml.with_suffix(".bin").is_file() else None}


@singledispatch
def source_record(source) -> dict:
    """A source as provenance records it, by its type: a path (hashed here), a record made already
    (`target_record`) and, registered where each type lives, an opened GGUF (`gguf.read.GgufFile`), a
    model's tensors (`ir.tensors.TensorSource`) and a file taken from the hub (`gguf.hub.HubFile`)."""
    raise TypeError(f"provenance records no {type(source).__name__} as a source")


@source_record.register
def _recorded(source: dict) -> dict:
    return source


@source_record.register(str)
@source_record.register(os.PathLike)
def _path(source) -> dict:
    return opened_record(source, sha256_path(source))


def opened_record(path, sha256: str, origin=None) -> dict:
    """A source's path and hash, and, for a file taken from the hub (`origin`, a `gguf.hub.HubFile`), its
    repository, revision and file name: the cache path alone would not say which repository and commit."""
    record = {"path": str(path), "sha256": sha256}
    if origin is not None:
        record["hub"] = origin.hub_record()
    return record
