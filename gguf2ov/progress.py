"""Progress bars on stderr, only when a person is watching."""

import contextlib
import os
import sys
import warnings

from tqdm import tqdm

_silenced = False


@contextlib.contextmanager
def silenced(quiet: bool = True):
    """No progress bar and no step line within the block (`--quiet`), whatever a stage asks for."""
    global _silenced
    previous, _silenced = _silenced, _silenced or quiet
    try:
        yield
    finally:
        _silenced = previous


def progress(iterable=None, *, desc: str, total: int | None = None, enabled: bool = True, unit: str = "it"):
    show = enabled and not _silenced and sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, disable=not show, unit=unit, leave=False, file=sys.stderr)


def step(message: str, enabled: bool = True) -> None:
    """One line per pipeline step, so that long runs show where they are even without a tty."""
    if enabled and not _silenced:
        print(f"[gguf2ov] {message}", file=sys.stderr, flush=True)


_quiet = False


def quiet_third_party() -> None:
    """Keep the libraries' own chatter (tracer warnings, NNCF tables, loading bars) off the terminal.

    gguf2ov reports what it measured itself; `--debug` leaves all of this on.
    """
    global _quiet
    _quiet = True
    warnings.filterwarnings("ignore", module=r"(torch|transformers|optimum|nncf|openvino)(\.|$)")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

