"""The `gguf2ov` command: one subcommand per pipeline stage, plus `run` for the whole job.

Each command is a module of this package with `HELP` (and, where the command has more to say after
its options, `EPILOG`), `configure_parser(parser)` and `main(args) -> int`: it parses, opens what it
needs through the job (`job.Job`, the arguments shared in `args.py`), calls the stage functions
(`gguf2ov/stages/`) and hands the result to `output.emit` (the same --json FILE, --markdown FILE and
--quiet for every command). This is the only place that exits.
"""

import argparse
import importlib
import os
import signal
import sys

from .. import __version__
from ..errors import Gguf2ovError, is_reference_module, needs_reference, printable
from ..outputs import Terminated, os_error_hint, signals_unwind
from ..progress import quiet_third_party, silenced
from .output import require_report_paths

# (subcommand, module of this package). Modules keep heavy imports (openvino, transformers) inside
# functions so that `gguf2ov inspect` starts fast. PyTorch is for tests and fixtures only.
COMMANDS = [
    ("inspect", "inspect"),
    ("convert", "convert"),
    ("check", "check"),
    ("export", "export"),
    ("target", "target"),
    ("verify", "verify"),
    ("drift", "drift"),
    ("accept", "accept"),
    ("ovms", "ovms"),
    ("run", "run"),
    ("widen-target", "widen"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gguf2ov",
        description="Convert speculative-decoding drafts published as GGUF into verified OpenVINO IR drafts.",
    )
    parser.add_argument("--version", action="version", version=f"gguf2ov {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        mod = importlib.import_module(f".{module}", __package__)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, epilog=getattr(mod, "EPILOG", None))
        mod.configure_parser(p)
        # accepted after the subcommand too; SUPPRESS keeps `gguf2ov --debug CMD` working
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error (or set GGUF2OV_DEBUG=1)")
        p.set_defaults(func=mod.main)
    return parser


def main(argv=None) -> int:
    _robust_streams()
    with signals_unwind():  # SIGTERM and SIGHUP unwind like Ctrl-C: temporary outputs are removed
        return _main(argv)


def _main(argv) -> int:
    try:
        parser = build_parser()  # imports every stage module: Ctrl-C lands here at start-up
    except KeyboardInterrupt as e:
        print(f"error: {_stopped(e)}", file=sys.stderr)
        return _stopped_code(e)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    debug = args.debug or os.environ.get("GGUF2OV_DEBUG") == "1"
    if not debug:
        quiet_third_party()
    try:
        require_report_paths(args)  # --json / --markdown FILE: refused before the work, not after it
        with silenced(getattr(args, "quiet", False)):
            code = args.func(args)
    except Gguf2ovError as e:
        if debug:
            raise
        print(f"error: {printable(e.message)}", file=sys.stderr)
        if e.hint:
            print(f"hint: {printable(e.hint)}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        # PyTorch or optimum-intel reached from a path that needs them, where they are not installed
        # (the `reference` extra): one line, not a traceback
        if debug or not is_reference_module(e.name):
            raise
        print(f"error: {printable(needs_reference(f'gguf2ov {args.command}').message)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"error: {_stopped(e)}; no partial output was left in place", file=sys.stderr)
        return _stopped_code(e)
    except MemoryError:
        print("error: out of memory", file=sys.stderr)
        return 1
    except OSError as e:  # unreadable input, an output path that is a folder, disk full, file-size limit
        if debug:
            raise
        print(f"error: {printable(_os_error_text(e))}", file=sys.stderr)
        print(f"hint: {_os_error_hint(e)}", file=sys.stderr)
        return 1
    return int(code or 0)


def _stopped(e: KeyboardInterrupt) -> str:
    return f"terminated by {e.args[0]}" if isinstance(e, Terminated) else "interrupted"


def _stopped_code(e: KeyboardInterrupt) -> int:
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)  # as a shell reports a signal


def _robust_streams() -> None:
    """Text a terminal cannot encode (PYTHONIOENCODING=ascii, a C locale) prints escaped, not a crash."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass  # not a TextIOWrapper (replaced by the caller), or closed


def _os_error_text(e: OSError) -> str:
    path = e.filename2 if e.filename2 is not None else e.filename  # a rename fails on its destination
    reason = e.strerror or str(e) or type(e).__name__
    return f"{path}: {reason}" if path is not None else reason


def _os_error_hint(e: OSError) -> str:
    return os_error_hint(e.errno)


if __name__ == "__main__":
    sys.exit(main())
