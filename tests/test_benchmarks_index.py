"""benchmarks/README.md indexes its folder: every script has a row in one of its tables (the row's first
cell links it), every row links a file that exists, and every other file there (a result page, a figure)
is linked from it. And wherever the repository's text names a benchmark, a command line or a path, it
names one that exists, in a form that runs: `python -m benchmarks.NAME` from the repository root, or
`python benchmarks/NAME.py` for a script that imports nothing of the repository. Scripts move between
folders; a command line left at the old place reads fine and fails when someone runs it."""

import ast
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
UNINDEXED = {"README.md", "__init__.py"}
ROW = re.compile(r"^\|\s*\[[^\]]*\]\(([^)#\s]+)\)")  # a table row whose first cell starts with a link
LINK = re.compile(r"\]\(([^)#\s]+)\)")
MODULE_COMMAND = re.compile(r"-m\s+benchmarks\.([A-Za-z0-9_.]+)")
FILE_COMMAND = re.compile(r"python[0-9.]*\s+(benchmarks/[A-Za-z0-9_/]+\.py)")
PATH = re.compile(r"(?<![\w/.])(benchmarks/[A-Za-z0-9_/]+\.py)")
TEXTS = ["README.md", "Makefile", "docs", "benchmarks", "tests", "fixtures", "gguf2ov"]


def _files(folder: Path) -> list[Path]:
    """The files under `folder` that are the project's: not what the scripts write (results/), not caches."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in ("results", "__pycache__")]
        found += [Path(root, n) for n in names if not n.endswith(".pyc")]
    return found


def index_problems(folder: Path) -> list[str]:
    """What the folder's README.md misses or gets wrong, one line each."""
    readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
    rows = [m.group(1) for line in readme.splitlines() if (m := ROW.match(line))]
    linked = set(LINK.findall(readme))
    problems = [f"README.md has a row for {target}, which does not exist" for target in rows
                if not (folder / target).is_file()]
    for path in sorted(_files(folder)):
        name = path.relative_to(folder).as_posix()
        if path.name in UNINDEXED:
            continue
        if path.suffix == ".py" and name not in rows:
            problems.append(f"{name} has no row in README.md")
        elif path.suffix != ".py" and name not in linked:
            problems.append(f"{name} is not linked from README.md")
    return problems


def _standalone(script: Path, folder: Path) -> bool:
    """Whether a script runs as a file: it imports nothing of the repository (no package, no sibling)."""
    own = {"benchmarks", "tests", "fixtures"} | {p.stem for p in folder.rglob("*.py")}
    for node in ast.walk(ast.parse(script.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if any(n.split(".")[0] in own for n in names):
            return False
    return True


def naming_problems(text: str, where: str, repo: Path = REPO) -> list[str]:
    """What is wrong with each benchmark command line and path in `text`, one line each."""
    folder = repo / "benchmarks"
    problems = []
    for module in MODULE_COMMAND.findall(text):
        module = module.rstrip(".")
        if module.isupper() or module.split(".")[-1].isupper():
            continue  # a placeholder: benchmarks.NAME
        if not (folder / Path(*module.split("."))).with_suffix(".py").is_file():
            problems.append(f"{where}: `-m benchmarks.{module}` names no script")
    for path in FILE_COMMAND.findall(text):
        if (repo / path).is_file() and not _standalone(repo / path, folder):
            problems.append(f"{where}: `python {path}` cannot run as a file (it imports the repository's "
                            f"modules): `python -m {path[:-3].replace('/', '.')}`")
    problems += [f"{where}: no file {path}" for path in PATH.findall(text)
                 if not (repo / path).is_file() and not Path(path).stem.isupper()]  # benchmarks/NAME.py: a placeholder
    return problems


def test_every_benchmark_has_its_row_and_every_row_its_benchmark():
    problems = index_problems(BENCHMARKS)
    assert not problems, "\n".join(problems)


def test_every_command_line_and_path_names_a_benchmark_that_runs():
    problems = []
    for top in TEXTS:
        for path in sorted(_files(REPO / top)) if (REPO / top).is_dir() else [REPO / top]:
            # this file's own examples (below) name what is wrong on purpose
            if path.suffix in (".py", ".md", "") and path.is_file() and path != Path(__file__):
                problems += naming_problems(path.read_text(errors="replace"), str(path.relative_to(REPO)))
    assert not problems, "\n".join(problems)


def test_no_script_edits_sys_path():
    """The scripts import one another, the tests' helpers and the fixtures' modules by their package names
    (`python -m` puts the repository on the path). count_work.py's `--package` puts another checkout's
    package first: that is what it measures."""
    edits = []
    for path in sorted(p for p in _files(BENCHMARKS) if p.suffix == ".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else \
                node.targets[0].value if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript) \
                else None
            if target is not None and ast.unparse(target) == "sys.path":
                edits.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert [e.split(":")[0] for e in edits] == ["benchmarks/count_work.py"], "\n".join(edits)


def test_the_checks_find_what_is_missing(tmp_path):
    """The checks above pass on a folder they cannot read: they must see what is wrong in one."""
    folder = tmp_path / "benchmarks"
    (folder / "llamacpp").mkdir(parents=True)
    for name in ("indexed.py", "unindexed.py", "llamacpp/tools.py", "llamacpp/__init__.py", "page.md", "plot.png"):
        (folder / name).write_text("import json\n")
    (folder / "packaged.py").write_text("from benchmarks.common import REPO\n")
    (folder / "README.md").write_text("\n".join([
        "| script | what |", "|---|---|",
        "| [indexed.py](indexed.py) | x |", "| [llamacpp/tools.py](llamacpp/tools.py) | x |",
        "| [packaged.py](packaged.py) | x |", "| [gone.py](gone.py) | x |", "",
        "See [page.md](page.md).",
    ]))
    assert index_problems(folder) == ["README.md has a row for gone.py, which does not exist",
                                      "plot.png is not linked from README.md", "unindexed.py has no row in README.md"]
    text = "\n".join([
        "python -m benchmarks.llamacpp.tools", "python -m benchmarks.NAME", "python benchmarks/indexed.py",
        "python -m benchmarks.llamacpp_tools --jobs 2", "python benchmarks/packaged.py", "see benchmarks/llamacpp.py",
    ])
    assert [p.split(": ", 1)[1] for p in naming_problems(text, "page", tmp_path)] == [
        "`-m benchmarks.llamacpp_tools` names no script",
        "`python benchmarks/packaged.py` cannot run as a file (it imports the repository's modules): "
        "`python -m benchmarks.packaged`",
        "no file benchmarks/llamacpp.py"]
