"""What produced an output: package versions, source hashes, options. Stored in every output."""

import hashlib
import platform
import sys
from datetime import datetime, timezone
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
    """The record; a source is a path, an opened file with `.path` and its cached `.sha256`, or a
    file taken from the hub (`hub.HubFile`), recorded with its repository, revision and file name."""
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "sources": {k: source_record(v) for k, v in (sources or {}).items()},
        "options": options or {},
    }


def source_record(source) -> dict:
    path = getattr(source, "path", source)
    record = {"path": str(path), "sha256": getattr(source, "sha256", None) or sha256_path(path)}
    if hasattr(source, "hub_record"):  # the cache path alone would not say which repository and commit
        record["hub"] = source.hub_record()
    return record
