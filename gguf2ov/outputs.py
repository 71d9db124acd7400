"""Writing outputs so that a failed or interrupted run leaves nothing half-written.

Everything is written into a temporary sibling first and renamed into place only when complete.
The sibling is named `.NAME.partial-PID-HOST-XXXXXXXX`. A run that ends by an exception, Ctrl-C or
SIGTERM removes its own (the CLI turns SIGTERM and SIGHUP into the same unwinding as Ctrl-C, see
`signals_unwind`); one killed outright (SIGKILL, a power cut) cannot, so the next run that writes
NAME removes the temporary siblings whose process is gone (`clear_stale`).
Only a regular file or a new path is written as a file output: a device or a FIFO given as a
report path is refused, not replaced by a regular file.

Disk space: a command that writes a folder estimates the bytes it is about to write and refuses
before any work when the file system holding the output (and its temporary sibling) has less free
(`require_space`); a write that fails anyway (another process filled the disk, the folder became
read-only or vanished) is one error naming the file and the reason, the errno's where the library
gives none (`writing`), and the partial folder is removed as on any failure.
"""

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
from pathlib import Path

from .errors import Gguf2ovError, WriteError

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


# --- disk space --------------------------------------------------------------------------------------

# The estimate is within a few percent of what is written: room for that, and for the blocks a file
# system rounds each file up to.
SPACE_MARGIN = 1.05
SPACE_SLACK = 256 << 10
# Below this, a write that failed without an errno (OpenVINO's serializer says "basic_ios::clear:
# iostream error") failed because the disk is full.
FULL_BELOW = 1 << 20


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def free_bytes(path) -> tuple[int, Path]:
    """(bytes free to this user, the folder measured) on the file system that holds `path` (or would)."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize, existing


def require_space(path, needed: int, what: str, hint: str | None = None) -> None:
    """Refuse before any work when the file system of `path` has less free than the `needed` bytes
    `what` writes there (and a margin)."""
    free, where = free_bytes(path)
    if os.statvfs(where).f_flag & os.ST_RDONLY:
        raise WriteError(f"cannot write {path}: the file system of {where} is read-only",
                         hint=os_error_hint(errno.EROFS))
    if free < needed * SPACE_MARGIN + SPACE_SLACK:
        raise Gguf2ovError(f"not enough disk space for {path}: {what} takes about {human_bytes(needed)}, "
                           f"{human_bytes(free)} is free on the file system of {where}",
                           hint=hint or "write to another folder (-o) or free some space")


_OS_HINTS = {
    errno.EACCES: "check the permissions of the path (and of its folders)",
    errno.EPERM: "check the permissions of the path (and of its folders)",
    errno.EISDIR: "give a file path, not a folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ENOENT: "check that the path and its folder exist",
    errno.ENOSPC: "free some disk space (or write elsewhere) and run again",
    errno.EDQUOT: "free some disk space (or write elsewhere) and run again",
    errno.EFBIG: "the file-size limit was reached (ulimit -f); raise it or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
}


def os_error_hint(code: int | None) -> str:
    """What to do about a failed file operation, by its errno."""
    return _OS_HINTS.get(code, "check the path and the file system, then run again")


def _write_failure(path: Path, error: BaseException) -> tuple[str, int] | None:
    """(why writing `path` failed, as an errno names it, the errno); None when `error` is not a failed
    write. A library that gives no errno (OpenVINO's serializer: "basic_ios::clear: iostream error")
    gets the one the file system's state shows."""
    if isinstance(error, OSError) and error.errno is not None:
        code = error.errno
    elif not isinstance(error, (OSError, RuntimeError)):
        return None
    else:
        folder = Path(path).absolute().parent
        try:
            st = os.statvfs(folder) if folder.exists() else None
        except OSError:
            st = None
        if not folder.exists():
            return f"{os.strerror(errno.ENOENT)} (ENOENT): the folder {folder} no longer exists", errno.ENOENT
        if st is not None and st.f_flag & os.ST_RDONLY:
            code = errno.EROFS
        elif st is not None and st.f_bavail * st.f_frsize < FULL_BELOW:
            code = errno.ENOSPC
        elif not os.access(folder, os.W_OK):
            code = errno.EACCES
        else:
            return None  # not the disk's doing: the library's own error stands
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})", code


@contextlib.contextmanager
def writing(path):
    """Around a library's write of `path` (OpenVINO's save_model, safetensors, a copy): a write that
    fails because of the disk is one Gguf2ovError naming the file and the reason."""
    try:
        yield
    except Gguf2ovError:
        raise
    except Exception as e:
        failure = _write_failure(Path(path), e)
        if failure is None:
            raise
        raise WriteError(f"cannot write {path}: {failure[0]}", hint=os_error_hint(failure[1])) from e


def write_out(fd) -> None:
    """What was written to the file `fd` put on disk and dropped from the page cache (each step where the
    system has it: macOS has neither call)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


# Bytes a file being written grows by between two flushes of `written_back`.
WRITEBACK_BYTES = 256 << 20


@contextlib.contextmanager
def written_back(path, period: float = 0.1):
    """While a library writes the file `path` (OpenVINO's .bin): every WRITEBACK_BYTES it grows by, what
    it wrote is flushed to disk (fdatasync) and dropped from the page cache, from a thread beside the
    writer. On this machine the kernel's own writeback of a file written fast is ~4x slower than
    flushing it so (8 GiB: 160 against 650 MB/s, docs/real-size.md), and written pages not yet on disk
    count in a memory limit; the file is read back mapped, not from the cache, anyway."""
    stop = threading.Event()

    def flush():
        fd, flushed = None, 0
        try:
            while not stop.wait(period):
                try:
                    if fd is None:
                        fd = os.open(path, os.O_RDONLY)
                    size = os.fstat(fd).st_size
                    if size - flushed >= WRITEBACK_BYTES:
                        write_out(fd)
                        flushed = size
                except FileNotFoundError:
                    continue  # not created yet
                except OSError:
                    return  # a file that cannot be flushed so: the kernel's writeback then
        finally:
            if fd is not None:
                os.close(fd)

    thread = threading.Thread(target=flush, name="written_back", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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
    held = None  # the folder held open: its inode cannot be reused by a folder made again at its path
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()  # the usual mode (umask), like the folder it becomes
            held = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise Gguf2ovError(f"cannot create the output {path}: {e.strerror}") from e
        yield tmp
        if before_commit is not None:
            before_commit(tmp)
        _require_same_folder(tmp, held, path)
    except BaseException as e:
        with _signals_deferred():
            shutil.rmtree(tmp, ignore_errors=True)
            if held is not None:
                os.close(held)
        if isinstance(e, Gguf2ovError) and str(tmp) in e.message:  # a file named where it would have been
            e.message = e.message.replace(str(tmp), str(path))
        raise
    with _signals_deferred():  # a signal now would leave the output renamed away
        os.close(held)
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


def _require_same_folder(tmp: Path, held: int, path: Path) -> None:
    """Refuse to put in place a temporary folder that is not the one made (`held` open): removed by
    another process while it was written (a later write may have made a new one, without what was
    written before)."""
    made = os.fstat(held)
    try:
        now = tmp.stat()
    except OSError:
        now = None
    if made.st_nlink == 0 or now is None or (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
        raise WriteError(f"cannot write {path}: its folder was removed while it was written (by another process?)",
                         hint="write it again, to a folder nothing else cleans up")


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
            reason, code = _write_failure(path, e) or (str(e), None)
            raise WriteError(f"cannot write {path}: {reason}", hint=os_error_hint(code)) from e
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
