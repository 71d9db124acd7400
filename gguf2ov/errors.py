"""The one exception type users see.

Raise `Gguf2ovError` where the user can act on it: name the file, key or tensor, say what was
expected, and put the next step in `hint`. `cli.main()` prints it as one line (plus the hint)
and exits non-zero; anything else is a bug and keeps its traceback under `--debug`.
"""

import contextlib


class Gguf2ovError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class WriteError(Gguf2ovError):
    """An output that could not be written (a full disk, a read-only or vanished folder): not a verdict
    on the input, so a run stops on it instead of reporting a failed stage in a report it cannot write."""


def library_message(error: Exception, limit: int = 300) -> str:
    """The informative line of an OpenVINO / GenAI exception.

    Their messages start with "Exception from src/...cpp:84:" lines that name only the C++ source.
    """
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Exception from") and not line.startswith("Check '")]
    return ((useful or lines or [type(error).__name__])[0])[:limit]


def printable(text) -> str:
    """`text` with every non-printable character escaped the way repr() does (\\n, \\x1b, \\u202e).

    Tensor names and metadata come from untrusted files: raw, a crafted name could break an error
    into several lines, fake a `hint:` line or send terminal escape sequences.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# PyTorch and optimum-intel, the `reference` extra: the fixtures, the PyTorch references and the
# comparisons with optimum-intel's own exports use them. Nothing a command of the core runs does.
REFERENCE_MODULES = frozenset({"torch", "torchvision", "optimum"})
REFERENCE_INSTALL = "pip install 'gguf2ov[reference]'"


def is_reference_module(name) -> bool:
    """Whether a module name (ModuleNotFoundError.name) is part of the reference stack."""
    return bool(name) and str(name).split(".")[0] in REFERENCE_MODULES


def needs_reference(what: str) -> Gguf2ovError:
    """The one-line error of a code path that needs the reference stack where it is not installed."""
    return Gguf2ovError(f"{what} needs PyTorch and optimum-intel: {REFERENCE_INSTALL}")


@contextlib.contextmanager
def reference_imports(what: str):
    """Around imports of torch or optimum: their absence becomes `needs_reference(what)`."""
    try:
        yield
    except ModuleNotFoundError as e:
        if not is_reference_module(e.name):
            raise
        raise needs_reference(what) from e


def require_reference(what: str) -> None:
    """Fail with `needs_reference(what)` unless torch and optimum-intel import."""
    with reference_imports(what):
        import torch  # noqa: F401
        import optimum.exporters.openvino  # noqa: F401  (optimum-intel's exporter)
