"""What `pip install .` gets: every subpackage and the maps in the wheel, a core without PyTorch, and
the one set of reference pins that scripts/install.sh installs."""

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0].lower()


def test_every_subpackage_is_packaged():
    setuptools = PROJECT["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gguf2ov").rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | {"gguf2ov.tensor_maps"}
    assert setuptools["package-dir"] == {"gguf2ov.tensor_maps": "tensor_maps"}
    assert (REPO / "tensor_maps" / "__init__.py").is_file() and list((REPO / "tensor_maps").glob("*.yaml"))
    assert setuptools["package-data"]["gguf2ov.tensor_maps"] == ["*.yaml"]


def test_the_core_holds_no_pytorch():
    core = {_name(r) for r in PROJECT["project"]["dependencies"]}
    extras = PROJECT["project"]["optional-dependencies"]
    assert not core & {"torch", "torchvision", "optimum", "optimum-intel"}
    assert {_name(r) for r in extras["reference"]} == {"torch", "optimum", "optimum-intel"}
    assert all("==" in r for r in extras["reference"])  # the versions measured together
    assert PROJECT["project"]["license"] == "Apache-2.0"  # an SPDX expression: no deprecated table


def test_install_sh_installs_the_reference_pins():
    script = (REPO / "scripts" / "install.sh").read_text()
    block = script[script.index("pins() {"):]
    block = block[:block.index("\nEOF\n}") + 6]
    for name in ("torch", "optimum", "optimum-intel"):
        out = subprocess.run(["bash", "-c", block.replace(".venv/bin/python", "python3") + f"\npins {name}"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
        assert out == [r for r in PROJECT["project"]["optional-dependencies"]["reference"] if _name(r) == name]
    # optimum-intel goes in with --no-deps, after everything else
    installs = [line.strip() for line in script.splitlines() if re.match(r"\s*(\$pip|editable) ", line)]
    assert installs[-1] == "$pip install --no-deps $(pins optimum-intel)", installs
