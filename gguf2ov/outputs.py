"""Writing outputs so that a failed or interrupted run leaves nothing half-written.

Everything is written into a temporary sibling first and renamed into place only when complete.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import Gguf2ovError


def check_output_dir(path: Path, overwrite: bool, inputs=()) -> None:
    """Refuse an output that exists (unless `overwrite`), is not a folder, or holds one of `inputs`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise Gguf2ovError(f"output {path} exists and is not a folder", hint="choose a folder path for the output")
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise Gguf2ovError(f"cannot create the output {path}: {existing} is a file, not a folder")
    resolved = path.resolve()
    for item in inputs:
        if item is not None and (Path(item).resolve() == resolved or Path(item).resolve().is_relative_to(resolved)):
            # --overwrite replaces the whole folder: it must never take an input with it
            raise Gguf2ovError(f"output {path} would replace the input {item}",
                               hint="write the output to a folder that holds none of the inputs")
    if path.exists() and not overwrite and any(path.iterdir()):
        raise Gguf2ovError(
            f"output {path} already exists",
            hint="choose a new output path or pass --overwrite",
        )


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = False, inputs=()):
    """Yield a temporary directory that becomes `path` when the block finishes without error."""
    path = Path(path)
    check_output_dir(path, overwrite, inputs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    except OSError as e:
        raise Gguf2ovError(f"cannot create the output {path}: {e.strerror}") from e
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the finished folder gets the usual mode
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_bytes(path, data: bytes) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        raise Gguf2ovError(f"cannot write {path}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a finished file gets the usual mode
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):  # disk full, file-size limit, the path is a folder: name the path
            raise Gguf2ovError(f"cannot write {path}: {e.strerror or e}",
                               hint="check the path, its permissions and the free disk space") from e
        raise


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
