"""Writing outputs so that a failed or interrupted run leaves nothing half-written.

Everything is written into a temporary sibling first and renamed into place only when complete.
The sibling is named `.NAME.partial-PID-HOST-XXXXXXXX`. A run that ends by an exception, Ctrl-C or
SIGTERM removes its own (the CLI turns SIGTERM and SIGHUP into the same unwinding as Ctrl-C, see
`signals_unwind`); one killed outright (SIGKILL, a power cut) cannot, so the next run that writes
NAME removes the temporary siblings whose process is gone (`clear_stale`).
Only a regular file or a new path is written as a file output: a device or a FIFO given as a
report path is refused, not replaced by a regular file.
"""

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
from pathlib import Path

from .errors import Gguf2ovError

# This machine's name in temporary names: another machine sharing the folder has other process ids.
_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:24] or "host"


def require_output_dir(path: Path, overwrite: bool, inputs=()) -> None:
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


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def require_output_file(path) -> None:
    """Refuse a file output (a report) that is neither a regular file nor a new path in a folder
    that can be written: checked before the work, so that the work is not done for nothing."""
    if path is None:
        return
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new path (its folders are checked below)
        mode = None
    except OSError as e:  # a symlink loop, a name too long, a folder on the way that cannot be searched
        raise Gguf2ovError(f"cannot write {path}: {e.strerror or e}", hint="check the path") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        raise Gguf2ovError(f"cannot write {path}: it is {kind}, not a regular file",
                           hint="give the path of a regular file or a new one")
    parent = path.absolute().parent
    existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise Gguf2ovError(f"cannot write {path}: {existing} is a file, not a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise Gguf2ovError(f"cannot write {path}: {existing} is not writable",
                           hint="check the permissions of the folder, or write elsewhere")


def relocated(result, tmp, final):
    """`result` (a dataclass, dict, list or path text) with every path under the temporary folder
    `tmp` named under `final`, where it is once the folder is put in place."""
    import dataclasses

    tmp, final = str(tmp), str(final)
    if isinstance(result, str):
        return final + result[len(tmp):] if result == tmp or result.startswith(tmp + os.sep) else result
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        changes = {f.name: relocated(getattr(result, f.name), tmp, final) for f in dataclasses.fields(result)
                   if f.init}
        return dataclasses.replace(result, **changes)
    if isinstance(result, dict):
        return {k: relocated(v, tmp, final) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(relocated(v, tmp, final) for v in result)
    return result


# --- temporary siblings ---------------------------------------------------------------------------

def _temp_path(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{_HOST}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process, or a number no process can have: leave it alone
    return True


def clear_stale(path) -> list[Path]:
    """Remove the temporary siblings of `path` that a run on this machine left when it was killed
    (its process is gone); returns what was removed. Siblings of live runs are never touched."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + r"(?:partial|old)-(\d{1,10})-([A-Za-z0-9]+)-[0-9a-f]{8}")
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if not m or m.group(2) != _HOST or _alive(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = False, inputs=(), before_commit=None):
    """Yield a temporary directory that becomes `path` when the block finishes without error.

    `before_commit(tmp)`, if given, runs after the block and before the rename: a failure there
    (e.g. a report that cannot be written) still leaves nothing in place.
    """
    path = Path(path)
    require_output_dir(path, overwrite, inputs)
    clear_stale(path)
    tmp = _temp_path(path, "partial")  # named before it exists, so an interruption at any point removes it
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()  # the usual mode (umask), like the folder it becomes
        except OSError as e:
            raise Gguf2ovError(f"cannot create the output {path}: {e.strerror}") from e
        yield tmp
        if before_commit is not None:
            before_commit(tmp)
    except BaseException:
        with _signals_deferred():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    with _signals_deferred():  # a signal now would leave the output renamed away
        old = _temp_path(path, "old") if path.exists() else None
        try:
            if old is not None:
                path.rename(old)
            tmp.rename(path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and old.exists() and not path.exists():
                old.rename(path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path, data: bytes) -> None:
    path = Path(path)
    if path.is_symlink():  # write the file the link names; replacing would turn the link into a file
        path = Path(os.path.realpath(path))
    require_output_file(path)
    clear_stale(path)
    tmp = _temp_path(path, "partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the usual mode (umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        with _signals_deferred():
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


# --- signals --------------------------------------------------------------------------------------

class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, so that it unwinds like Ctrl-C: every
    `except BaseException` / `finally` that removes a temporary output runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_deferred = 0       # depth of _signals_deferred blocks
_pending = None     # a signal that arrived inside one


def _on_signal(signum, frame):
    global _pending
    if _deferred:
        _pending = signum
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def _signals_deferred():
    """A signal that arrives inside the block is raised when it ends (renaming outputs into place
    or removing a temporary folder is never left half done)."""
    global _deferred, _pending
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
        if not _deferred and _pending is not None:
            signum, _pending = _pending, None
            _on_signal(signum, None)


@contextlib.contextmanager
def signals_unwind():
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt) like Ctrl-C
    raises KeyboardInterrupt; signals the caller ignores (nohup) stay ignored. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
