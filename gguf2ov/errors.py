"""The one exception type users see.

Raise `Gguf2ovError` where the user can act on it: name the file, key or tensor, say what was
expected, and put the next step in `hint`. `cli.main()` prints it as one line (plus the hint)
and exits non-zero; anything else is a bug and keeps its traceback under `--debug`.
"""


class Gguf2ovError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


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
