"""The core install: gguf2ov without PyTorch and optimum-intel (`pip install .`).

Each test runs a Python whose site-packages are this environment's less torch, torchvision and
optimum (optimum-intel lives in optimum's folder): a folder of links to every other entry, added
with `site.addsitedir` to an interpreter started without its own site-packages (a `.pth` file that adds
another folder, such as another environment's site-packages, is pointed at a view of that folder too). For that Python
the reference stack is not installed at all, its metadata included, as after `pip install .`.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gguf2ov.cli.output import verdict_code

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "tiny-dflash"
# top-level names and .dist-info prefixes of the reference stack (and the folders torch ships)
HIDDEN = ("torch", "torchgen", "functorch", "torchvision", "optimum")
HIDDEN_DISTS = ("torch-", "torchvision-", "optimum-", "optimum_intel-")
NEEDS = "needs PyTorch and optimum-intel: pip install 'gguf2ov[reference]'"
# The target's RoPE tables come from transformers' PyTorch modules until gguf2ov/ir/rope.py
# computes them in NumPy: until then, building a target says in one line that it needs PyTorch.
NUMPY_ROPE = importlib.util.find_spec("gguf2ov.ir.rope") is not None

BOOT = """
import runpy, site, sys
site.addsitedir(sys.argv.pop(1))
if sys.argv[1] == "-c":
    code = sys.argv.pop(2)
    sys.argv = sys.argv[1:]
    exec(compile(code, "<test>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = ["gguf2ov", *sys.argv[1:]]
    runpy.run_module("gguf2ov", run_name="__main__", alter_sys=True)
"""


def view_without_torch(dirs, view: Path) -> Path:
    """`view`: a folder of links to the entries of the site folders `dirs`, the reference stack left out.

    A `.pth` file that adds a folder (a venv that reuses another environment's site-packages) would bring
    the stack back from there: it is written into the view pointing at a view of that folder, made the
    same way (its `import` lines kept as they are)."""
    view.mkdir(parents=True, exist_ok=True)
    for d in dirs:
        for entry in Path(d).iterdir():
            name = entry.name
            top = name.split(".")[0].split("-")[0]
            if top in HIDDEN or name.startswith(HIDDEN_DISTS) or (view / name).exists():
                continue
            if name.endswith(".pth") and entry.is_file():
                (view / name).write_text("".join(_pth_line(line, Path(d), view) for line in
                                                 entry.read_text(encoding="utf-8").splitlines(keepends=True)))
            else:
                (view / name).symlink_to(entry)
    return view


def _pth_line(line: str, site: Path, view: Path) -> str:
    """One line of a .pth file as `site.addpackage` reads it: a folder it adds (relative to its site folder)
    becomes a view of that folder; comments, blank lines, `import` lines and missing folders stay as they are."""
    text = line.rstrip()
    if not text or text.startswith(("#", "import ", "import\t")) or not (site / text).is_dir():
        return line
    added = site / text
    folder = view / ".pth-folders" / hashlib.sha256(str(added.resolve()).encode()).hexdigest()[:16]
    return f"{view_without_torch([added], folder)}\n"


@pytest.fixture(scope="module")
def site_without_torch(tmp_path_factory) -> Path:
    dirs = dict.fromkeys(Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib"))
    return view_without_torch(dirs, tmp_path_factory.mktemp("site-without-torch"))


def test_a_pth_file_that_adds_another_environments_site_packages_does_not_bring_torch_back(tmp_path):
    """A venv whose .pth file adds another venv's site-packages (which has torch): the view hides the stack
    there too, and keeps the rest of that folder."""
    other = tmp_path / "other-venv-site"
    for package in ("torch", "keptpackage"):
        (other / package).mkdir(parents=True)
        (other / package / "__init__.py").write_text("")
    (other / "torch-2.0.0.dist-info").mkdir()
    (other / "torch-2.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.0.0\n")
    site = tmp_path / "venv-site"
    site.mkdir()
    (site / "other.pth").write_text(f"# the other environment\n{other}\nimport sys\n")
    view = view_without_torch([site], tmp_path / "view")
    p = run(view, "-c", """
import importlib.metadata as md, importlib.util as u
print(u.find_spec("torch") is None, u.find_spec("keptpackage") is not None)
try:
    md.version("torch")
    print("torch is installed")
except md.PackageNotFoundError:
    print("no torch")
""")
    assert p.returncode == 0 and p.stdout.split() == ["True", "True", "no", "torch"], (p.stdout, p.stderr[-3000:])


def run(view: Path, *args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -S` on the view: `gguf2ov ARGS`, or `-c CODE`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-S", "-c", BOOT, str(view), *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd or REPO, timeout=timeout)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "Traceback" not in p.stderr and len(lines) == 1, (p.returncode, p.stderr[-3000:])
    return lines[0]


def test_the_view_has_no_torch(site_without_torch):
    p = run(site_without_torch, "-c", """
import importlib.metadata as md, importlib.util as u
assert u.find_spec("torch") is None and u.find_spec("optimum") is None
for dist in ("torch", "optimum", "optimum-intel"):
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{dist} is still installed")
import gguf2ov, numpy, openvino, transformers
print("ok")
""")
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


def test_every_module_imports_without_torch(site_without_torch):
    """No module of the package imports torch or optimum when it is imported; the PyTorch reference
    of DFlash 2 says in one line what it needs instead."""
    p = run(site_without_torch, "-c", """
import pkgutil, sys
import gguf2ov
from gguf2ov.errors import Gguf2ovError
refused = []
for m in pkgutil.walk_packages(gguf2ov.__path__, "gguf2ov."):
    if m.name == "gguf2ov.__main__":  # runs the command line
        continue
    try:
        __import__(m.name)
    except Gguf2ovError as e:
        refused.append(f"{m.name}: {e}")
print("\\n".join(refused))
print(sorted(n for n in sys.modules if n.split(".")[0] in ("torch", "optimum")))
""")
    assert p.returncode == 0, p.stderr[-3000:]
    *refused, loaded = p.stdout.strip().splitlines()
    assert loaded == "[]"
    assert refused == [f"gguf2ov.tools.dflash2_torch: the DFlash 2 PyTorch reference {NEEDS}"]


def test_every_command_shows_its_help(site_without_torch):
    from gguf2ov.cli.app import COMMANDS

    p = run(site_without_torch, "--help")
    assert p.returncode == 0 and "widen-target" in p.stdout, p.stderr[-3000:]
    for name, _ in COMMANDS:
        p = run(site_without_torch, name, "--help")
        assert p.returncode == 0 and p.stdout.startswith("usage: gguf2ov " + name), (name, p.stderr[-3000:])


def test_a_path_that_needs_torch_says_so_in_one_line(site_without_torch, tmp_path):
    p = run(site_without_torch, "-c", """
from gguf2ov.errors import Gguf2ovError
from gguf2ov.tools.optimum_trace import trace_optimum
try:
    trace_optimum(None, "unused.xml")
except Gguf2ovError as e:
    print(e)
""")
    assert p.returncode == 0 and p.stdout.strip() == f"tracing optimum-intel's export of a draft {NEEDS}", p.stderr
    # the fixture builder trains in PyTorch
    line = one_error_line(run(site_without_torch, "-c", "import runpy, sys; sys.argv = ['make_fixtures.py', '--out', "
                              f"{str(tmp_path / 'fx')!r}]; sys.exit(runpy.run_path('fixtures/make_fixtures.py', "
                              "run_name='__main__'))"))
    assert line == f"error: building the fixtures {NEEDS}"
    assert not (tmp_path / "fx").exists()


@pytest.mark.slow
def test_export_and_accept_run_without_torch(site_without_torch, tmp_path):
    draft = tmp_path / "draft"
    p = run(site_without_torch, "export", FIXTURES / "draft-Q4_K_M.gguf", "-o", draft, "--quiet")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert (draft / "openvino_model.xml").is_file()
    report = tmp_path / "accept.json"
    p = run(site_without_torch, "accept", "--target", FIXTURES / "target", "--draft", draft,
            "--prompts", FIXTURES / "prompts.txt", "--max-new-tokens", 24, "--json", report, "--quiet")
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    data = json.loads(report.read_text())
    # the fixture target alone is too light on a CPU for the draft to pay off: PASS or SLOW
    assert p.returncode == verdict_code(data["verdict"]) and data["verdict"] in ("PASS", "SLOW"), data
    assert data["overall"]["accepted_tokens"] > 0 and data["overall"]["identical"]


@pytest.mark.slow
def test_target_and_widen_target_run_without_torch(site_without_torch, tmp_path):
    config = json.loads((FIXTURES / "target-hf" / "config.json").read_text())
    built = run(site_without_torch, "target", FIXTURES / "target-hf", "-o", tmp_path / "target", "--quiet")
    wide = run(site_without_torch, "widen-target", FIXTURES / "target-hf", "-o", tmp_path / "wide", "--extra-layers", 1,
               "--intermediate-size", config["intermediate_size"] + 128, "--json", tmp_path / "wide.json", "--quiet")
    if not NUMPY_ROPE:
        assert one_error_line(built) == f"error: gguf2ov target {NEEDS}"
        assert one_error_line(wide) == f"error: gguf2ov widen-target {NEEDS}"
        assert not (tmp_path / "target").exists() and not (tmp_path / "wide").exists()
        return
    for p in (built, wide):
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert (tmp_path / "target" / "openvino_model.xml").is_file()
    data = json.loads((tmp_path / "wide.json").read_text())
    assert data["layers"] == [config["num_hidden_layers"], config["num_hidden_layers"] + 1]
    assert max(data["max_abs_diff"].values()) < 1e-4
    assert {"openvino_model.xml", "openvino_tokenizer.xml", "config.json", "generation_config.json"} <= \
        {f.name for f in (tmp_path / "wide").iterdir()}
