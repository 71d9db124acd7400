"""The output contract every command shares (--json FILE, --markdown FILE, --quiet), run and checked:
tests/cli/test_output_contract.py holds each command to it, tests/test_run.py the whole run."""

import contextlib
import io
import json

from gguf2ov import cli
from gguf2ov.cli.output import VERDICT_CODES


def run_cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def reports(tmp_path, name: str) -> tuple:
    return tmp_path / f"{name}.json", tmp_path / f"{name}.md"


def quiet_run(argv, json_path, md_path) -> tuple[int, dict, str, str]:
    """Run with both reports and --quiet; check the contract every command shares."""
    code, out, err = run_cli([*argv, "--json", json_path, "--markdown", md_path, "--quiet"])
    assert code in (0, 1, *VERDICT_CODES.values())
    assert (out == "") == (code == 0), out  # a failed result is shown even under --quiet
    assert "[gguf2ov]" not in err, err  # no progress under --quiet
    assert "error:" not in err, err
    data = json.loads(json_path.read_text())
    md = md_path.read_text()
    assert md.startswith("## "), md[:200]
    assert "\n|---|" in md and "\n| " in md  # a Markdown table
    return code, data, md, out
