"""The output contract every command shares: `--json FILE`, `--markdown FILE` (`-` for either: that
document on stdout instead of the tables) and `--quiet`; `require_report_paths` refuses a bad report
path before the work, and `emit` shows and writes the command's result (rendered by `report`).
"""

import sys
from pathlib import Path

from ..errors import Gguf2ovError
from ..outputs import atomic_write_text, require_output_file
from ..report import render, write_reports

STDOUT = "-"
_FORMATS = {"json": "--json", "markdown": "--markdown"}

# The exit code of each acceptance verdict (`accept`, and `run`, whose verdict is its acceptances'), so
# that a script tells "the conversion is wrong" (MISMATCH, BROKEN; 1 for an error or a run stopped at
# another stage) from "the pair is right but does not pay on this device" (SLOW). 2 is argparse's
# usage error; 129, 130 and 143 a signal's (SIGHUP, SIGINT, SIGTERM).
VERDICT_CODES = {"PASS": 0, "SLOW": 3, "BROKEN": 4, "MISMATCH": 5}
VERDICT_EPILOG = ("exit codes: 0 PASS, 3 SLOW (identical text, proposals accepted, but the target is too light on "
                  "this device for the draft to pay), 4 BROKEN (attached but almost never accepted), 5 MISMATCH "
                  "(the text with the draft differs), 1 an error or a stage that failed; 130, 143, 129: interrupted "
                  "(Ctrl-C, SIGTERM, SIGHUP)")


def verdict_code(verdict: str) -> int:
    """The exit code of a verdict: VERDICT_CODES, else 1 (a run stopped at a stage: "FAILED at drift")."""
    return VERDICT_CODES.get(verdict, 1)


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
