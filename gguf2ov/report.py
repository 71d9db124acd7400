"""One report layer: every result renders as a terminal table, JSON or Markdown.

A result is a dataclass that may define:
- `tables() -> list[Table]`: what a person reads (built once, formatted three ways);
- `summary() -> list[str]`: a few lines shown above the tables (verdicts, totals);
- `json_flat() -> dict`: fields added at the top level of its JSON (a flat view of nested figures).
JSON is the dataclass itself, field by field (`to_jsonable`), so every field reaches the JSON file.

The command line's output options (`--json FILE`, `--markdown FILE`, `--quiet`) and `emit`, which
shows and writes a command's result, are in `cli/output.py`.
"""

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import printable
from .outputs import atomic_write_text, human_bytes  # noqa: F401  (human_bytes: the report layer's too)


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
