"""Progress bars on stderr, only when a person is watching."""

import sys

from tqdm import tqdm


def progress(iterable=None, *, desc: str, total: int | None = None, enabled: bool = True, unit: str = "it"):
    show = enabled and sys.stderr.isatty()
    return tqdm(iterable, desc=desc, total=total, disable=not show, unit=unit, leave=False, file=sys.stderr)


def step(message: str, enabled: bool = True) -> None:
    """One line per pipeline step, so that long runs show where they are even without a tty."""
    if enabled:
        print(f"[gguf2ov] {message}", file=sys.stderr, flush=True)
