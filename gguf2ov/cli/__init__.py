"""The command line: `gguf2ov COMMAND ...`; `app.py` dispatches to one module per command."""

from .app import main  # noqa: F401  the entry point
