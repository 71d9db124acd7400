"""One report layer: every result renders as a terminal table, JSON or Markdown.

A result is a dataclass that may define:
- `tables() -> list[Table]`: what a person reads (built once, formatted three ways);
- `summary() -> list[str]`: a few lines shown above the tables (verdicts, totals);
- `json_flat() -> dict`: fields added at the top level of its JSON (a flat view of nested figures).
JSON is the dataclass itself, field by field (`to_jsonable`), so every field reaches the JSON file.

Every command has the same output options (`add_output_arguments`): `--json FILE`, `--markdown FILE`
(`-` for either: that format on stdout instead of the tables) and `--quiet`; `require_report_paths`
refuses a bad report path before the work, and `emit` shows and writes the command's result.
"""

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import Gguf2ovError, printable
from .outputs import atomic_write_text, require_output_file


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list]
    note: str = ""


def fmt_cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3e}"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_cell(v) for v in value) + "]"
    return printable(value)  # names and metadata from untrusted files: no newlines or escape sequences


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _text_table(t: Table) -> str:
    cells = [[fmt_cell(c) for c in row] for row in t.rows]
    widths = [len(h) for h in t.headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [all(_looks_numeric(r[i]) for r in cells) if cells else False for i in range(len(t.headers))]

    def line(row):
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    out = [t.title, line(t.headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    if t.note:
        out.append(t.note)
    return "\n".join(out)


def _looks_numeric(s: str) -> bool:
    try:
        float(s.split()[0])
        return True
    except (ValueError, IndexError):
        return s == "-"


def _md_table(t: Table) -> str:
    esc = lambda s: fmt_cell(s).replace("|", "\\|")  # noqa: E731
    out = [f"### {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in t.rows]
    if t.note:
        out += ["", t.note]
    return "\n".join(out)


def to_jsonable(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        # a result may also give a flat view of nested figures, for scripts that read the top level
        return out | to_jsonable(obj.json_flat()) if hasattr(obj, "json_flat") else out
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def render(result, fmt: str = "text", title: str | None = None) -> str:
    tables = result.tables() if hasattr(result, "tables") else []
    summary = [printable(line) for line in result.summary()] if hasattr(result, "summary") else []
    if fmt == "json":
        return json.dumps(to_jsonable(result), indent=2) + "\n"
    if fmt == "markdown":
        parts = [f"## {title}"] if title else []
        if summary:
            parts.append("\n".join(f"- {s}" for s in summary))
        parts += [_md_table(t) for t in tables]
        return "\n\n".join(parts) + "\n"
    if fmt == "text":
        parts = [title] if title else []
        parts += [_text_table(t) for t in tables]
        if summary:
            parts.append("\n".join(summary))
        return "\n\n".join(parts) + "\n"
    raise ValueError(f"unknown report format {fmt!r}")


def write_reports(result, json_path=None, markdown_path=None, title: str | None = None) -> None:
    if json_path:
        atomic_write_text(json_path, render(result, "json"))
    if markdown_path:
        atomic_write_text(markdown_path, render(result, "markdown", title=title))


# --- the output contract of every command -----------------------------------------------------------

STDOUT = "-"
_FORMATS = {"json": "--json", "markdown": "--markdown"}


def add_output_arguments(parser, inputs=(), outputs=()) -> None:
    """`--json FILE`, `--markdown FILE` and `--quiet`, the same on every command.

    `inputs` and `outputs` name the command's own path arguments (their `dest`): a report may not
    replace an input (or a file in an input folder), nor be written inside an output folder that
    the command writes as a whole."""
    group = parser.add_argument_group("output")
    group.add_argument("--json", metavar="FILE",
                       help="also write the result as JSON (`-`: print the JSON on stdout instead of the tables)")
    group.add_argument("--markdown", metavar="FILE",
                       help="also write the result as Markdown (`-`: print it on stdout instead of the tables)")
    group.add_argument("--quiet", action="store_true",
                       help="no progress on stderr, and nothing on stdout unless the result fails (errors "
                            "and warnings still show)")
    parser.set_defaults(report_inputs=tuple(inputs), report_outputs=tuple(outputs))


def report_path(args, fmt: str) -> Path | None:
    """The file `--json` / `--markdown` names (None: not given, or `-` for stdout)."""
    value = getattr(args, fmt, None)
    return None if value is None or str(value) == STDOUT else Path(value)


def _stdout_format(args) -> str | None:
    return next((fmt for fmt in _FORMATS if str(getattr(args, fmt, None)) == STDOUT), None)


def _path_values(args, dests):
    for dest in dests:
        value = getattr(args, dest, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                yield Path(item)


def require_report_paths(args) -> None:
    """Refuse a bad `--json` / `--markdown` FILE before the work, so that the work is not done for
    nothing: a folder, a device or a FIFO, a file on the way where a folder should be
    (`outputs.require_output_file`), both reports on one path, one of the command's inputs or a path
    in an input folder, a path inside the output folder, or a folder that does not exist."""
    given = {fmt: getattr(args, fmt) for fmt in _FORMATS if getattr(args, fmt, None) is not None}
    if [str(v) for v in given.values()].count(STDOUT) > 1:
        raise Gguf2ovError("--json - and --markdown - both ask for stdout", hint="give one of them a file path")
    seen = {}
    for fmt, value in given.items():
        if str(value) == STDOUT:
            continue
        path = Path(value)
        require_output_file(path)
        resolved = path.resolve()
        if resolved in seen:
            raise Gguf2ovError(f"--json and --markdown both name {path}", hint="give each report its own path")
        seen[resolved] = fmt
        for item in _path_values(args, getattr(args, "report_inputs", ())):
            if resolved == item.resolve():
                raise Gguf2ovError(f"cannot write {path}: it is the input {item}",
                                   hint=f"write the {_FORMATS[fmt]} report to another path")
            if resolved.is_relative_to(item.resolve()):  # a report never changes an input folder
                raise Gguf2ovError(f"cannot write {path}: it is inside the input folder {item}",
                                   hint=f"write the {_FORMATS[fmt]} report outside {item}")
        for item in _path_values(args, getattr(args, "report_outputs", ())):
            if resolved.is_relative_to(item.resolve()):
                raise Gguf2ovError(f"cannot write {path}: it is inside the output folder {item}, "
                                   "which the command writes as a whole",
                                   hint=f"write the {_FORMATS[fmt]} report outside {item}")
        if not path.absolute().parent.is_dir():  # a typo in a folder name is not silently created
            raise Gguf2ovError(f"cannot write {path}: the folder {path.absolute().parent} does not exist",
                               hint="create the folder first, or write the report elsewhere")


def emit(result, args, *, title: str | None = None, text: str | None = None, markdown: str | None = None,
         code: int = 0, files: bool = True) -> int:
    """Write and show a command's result; returns `code`, the command's exit code.

    - `--json FILE` / `--markdown FILE`: written atomically (`write_reports`); `files=False` when the
      library function wrote them already (before its output folder was put in place);
    - stdout: `text` (default: the result's tables and summary) unless `--quiet`, and under `--quiet`
      too when `code` is not 0: the exit code alone would not say what failed; with `--json -` or
      `--markdown -`, that document instead.
    `title` heads the Markdown (default `gguf2ov COMMAND`); `markdown` replaces the rendered one."""
    title = title or f"gguf2ov {getattr(args, 'command', None) or 'report'}"
    if files:
        md_path = report_path(args, "markdown")
        write_reports(result, report_path(args, "json"), md_path if markdown is None else None, title=title)
        if markdown is not None and md_path is not None:
            atomic_write_text(md_path, markdown)
    fmt = _stdout_format(args)
    if fmt == "json":
        sys.stdout.write(render(result, "json"))
    elif fmt == "markdown":
        sys.stdout.write(markdown if markdown is not None else render(result, "markdown", title=title))
    elif not getattr(args, "quiet", False) or code != 0:
        sys.stdout.write(text if text is not None else render(result, "text"))
    return code


def stdout_is_report(args) -> bool:
    """True when `--json -` or `--markdown -` makes stdout a document: nothing else may go there."""
    return _stdout_format(args) is not None
