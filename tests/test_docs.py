"""Every relative link in README.md, docs/*.md and benchmarks/*.md lands: the file exists and, for a `#anchor`, the
heading is in that file under the anchor GitHub gives it. Pages and sections move between these
files; a link left pointing at an old place renders fine and leads nowhere, so nothing but a check
finds it. http(s) links are not followed: tests never reach the network."""

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").glob("*.md"))]

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)([\s\S]+?)\1")  # within a paragraph, it may wrap
# [text](target) and ![alt](target), the target up to an optional "title"; text may hold `code`.
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:


def _prose_lines(text: str):
    """(number, line, whether it can start a block) of the lines outside fenced code blocks: code
    shows links, it does not make them, and a line inside a paragraph is no reference definition."""
    fenced, previous = False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line, not previous.strip() or bool(FENCE.match(previous) or HEADING.match(previous))
        previous = line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (github-slugger): the rendered text lowercased, every character
    but letters, digits, `-`, `_` and spaces dropped, spaces made `-`."""
    text = INLINE_LINK.sub(lambda m: m.group(1), heading)  # a link's text is rendered, not its target
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags render as nothing
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings; a repeated one gets -1, -2, ... as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for _, line, _ in _prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = anchor = slug(m.group(2))
        while anchor in found:
            seen[base] += 1
            anchor = f"{base}-{seen[base]}"
        found.add(anchor)
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link on a page, inline or as a reference definition. Inline
    links are found paragraph by paragraph, since a link's text may wrap; a code span shows text
    such as `[a](b)` verbatim, so a link that starts inside one is none."""
    found = []
    prose = {number: line for number, line, _ in _prose_lines(text)}
    paragraph: list[tuple[int, str]] = []
    for number in range(1, len(text.splitlines()) + 2):
        line = prose.get(number, "")
        if line.strip():
            paragraph.append((number, line))
            continue
        joined = "\n".join(line for _, line in paragraph)
        spans = [m.span() for m in CODE_SPAN.finditer(joined)]
        for m in INLINE_LINK.finditer(joined):
            if not any(a <= m.start() < b for a, b in spans):
                found.append((paragraph[joined.count("\n", 0, m.start())][0], m.group(2)))
        paragraph = []
    for number, line, starts_block in _prose_lines(text):
        m = REFERENCE_DEFINITION.match(line)
        if m and starts_block:
            found.append((number, m.group(1)))
    return sorted(found)


def broken_links(page: Path, repo: Path = REPO) -> list[str]:
    """What is wrong with each relative link of a page, one line each, naming the page and the line."""
    problems = []
    for number, target in links(page.read_text()):
        if not target or EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page.resolve()
        where = f"{page.relative_to(repo)}:{number}: {target}"
        if not linked.is_relative_to(repo.resolve()):
            problems.append(f"{where}: points outside the repository")
        elif not linked.exists():
            problems.append(f"{where}: no file {linked.relative_to(repo.resolve())}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {linked.relative_to(repo.resolve())}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_lands(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_the_pages_link_to_something():
    """The check above passes on a page whose links it cannot see: it must see the README's."""
    targets = [t for _, t in links((REPO / "README.md").read_text())]
    assert any(t.startswith("docs/") and "#" in t for t in targets), targets
    assert len(PAGES) > 1  # docs/ is there


def test_anchors_follow_githubs_rules():
    text = "\n".join([
        "# Serving with OpenVINO Model Server: `gguf2ov ovms`",
        "## Hub names: `org/repo:QUANT`, as llama.cpp's `-hf` takes them",
        "## The draft's own embedding and head",
        "## Notes", "### Notes", "## Notes",
        "```", "# not a heading: inside a fence", "```",
        "## [A link](x.md) and snake_case",
    ])
    assert anchors(text) == {
        "serving-with-openvino-model-server-gguf2ov-ovms",
        "hub-names-orgrepoquant-as-llamacpps--hf-takes-them",
        "the-drafts-own-embedding-and-head",
        "notes", "notes-1", "notes-2",
        "a-link-and-snake_case",
    }


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A section\n")
    readme = tmp_path / "README.md"
    readme.write_text("\n".join([
        "# Title",
        "[fine](docs/page.md#a-section) [fine too](#title) [web](https://example.com/#nothing)",
        "[no file](docs/gone.md)",
        "[no anchor](docs/page.md#a-sectoin)",
        "![no image](docs/plot.png)",
        "[here, no anchor](#missing)",
        "`[shown, not linked](docs/gone.md)`",
        "```", "[in a fence](docs/gone.md)", "```",
        "[ref]: docs/also-gone.md",
        "text, then in the same paragraph",
        "[1, 2]: no definition, but [a link whose text",
        "wraps](docs/gone-too.md)",
    ]))
    problems = broken_links(readme, tmp_path)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "README.md:3", "README.md:4", "README.md:5", "README.md:6", "README.md:11", "README.md:13"], problems
    assert "no heading with the anchor #a-sectoin in docs/page.md" in problems[1]


# --- the lists the docs keep of the code ---------------------------------------------------------------
# Each list a page keeps of what the code holds (maps, architectures, kinds, modules) is held to the code
# both ways: an entry the code lacks, and what the code has that the list does not name.

PACKAGE = REPO / "gguf2ov"
NAME = re.compile(r"^[A-Za-z_]\w*(\.py)?$")  # a module, or a name defined in one, as a table cell names it


def table(page: Path, heading: str) -> list[list[str]]:
    """The body rows of the first table under `heading` on a page, each row's cells stripped."""
    lines = page.read_text().splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows, f"{page.relative_to(REPO)}: no table under {heading!r}"
    return rows[2:]  # the header and its rule


def code_names(cell: str) -> list[str]:
    return [m.group(2) for m in CODE_SPAN.finditer(cell)]


def test_the_shipped_maps_table_names_every_map():
    from gguf2ov.maps.load import known_arches

    named = [code_names(row[0])[0] for row in table(REPO / "docs" / "maps.md", "## Shipped maps")]
    assert sorted(named) == known_arches(), "docs/maps.md's table of shipped maps"


def test_the_target_architectures_table_names_every_target_and_its_kinds():
    from gguf2ov.targets.config import target_maps

    rows = {code_names(r[0])[0]: r for r in table(REPO / "docs" / "targets.md", "## Target architectures")}
    maps = {m.arch: m for m in target_maps()}
    assert sorted(rows) == sorted(maps), "docs/targets.md's table of target architectures"
    for arch, row in rows.items():
        target = maps[arch].target
        kinds = {*target["mixers"].values(), target["mlp"]} | \
            {step["block"] for step in target.get("layer", []) if step.get("block") not in ("mixer", "mlp")}
        assert code_names(row[1]) == [maps[arch].hf["model_type"]], arch
        assert set(code_names(row[2])) == kinds, arch


def test_the_layer_kinds_table_names_every_registered_kind():
    from gguf2ov.targets.layers import REGISTRY

    rows = table(REPO / "docs" / "targets.md", "### Layer kinds")
    shipped = {name: kind for name, kind in REGISTRY.items() if type(kind).__module__.startswith("gguf2ov.")}
    assert sorted(code_names(r[0])[0] for r in rows) == sorted(shipped), "docs/targets.md's table of layer kinds"
    for row in rows:
        kind = shipped[code_names(row[0])[0]]
        assert (row[1], code_names(row[2])) == (kind.ROLE, [type(kind).__module__.rsplit(".", 1)[1]]), kind.NAME


def _defined(folder: Path) -> set[str]:
    """The modules of a package folder, its subfolders, and the names its modules define at the top."""
    import ast

    names = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    for path in folder.glob("*.py"):
        names.add(path.stem)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_the_code_layout_table_names_every_folder_and_module():
    """Every package folder has its row in docs/development.md's code layout, every module of it is named
    there, and every name a row gives is a module, a subfolder or a name defined in that folder."""
    folders = {}
    for row in table(REPO / "docs" / "development.md", "## Code layout"):
        first = code_names(row[0])
        folder = first[0].rstrip("/") if first and first[0].endswith("/") else ""  # else the top level
        folders.setdefault(folder, []).extend(code_names(" | ".join(row)))
    package = {str(p.parent.relative_to(PACKAGE)).replace(".", "") for p in PACKAGE.rglob("__init__.py")}
    assert sorted(folders) == sorted(package), "docs/development.md's code layout: the package folders"
    for folder, names in folders.items():
        here = PACKAGE / folder
        modules = {p.stem for p in here.glob("*.py") if not p.stem.startswith("__")}
        named = {n.removesuffix(".py") for n in names if NAME.match(n)}
        paths = [n for n in names if "/" in n and n.rstrip("/") != folder]  # a subfolder, or a file
        assert modules <= named, f"{folder or 'top level'}: modules the code layout does not name: {modules - named}"
        assert named <= _defined(here), f"{folder or 'top level'}: names no module there defines: " \
                                        f"{named - _defined(here)}"
        missing = [p for p in paths if not any(base.exists() for base in (here / p, PACKAGE / p, PACKAGE / f"{p}.py",
                                                                           REPO / p))]
        assert not missing, f"{folder or 'top level'}: paths that do not exist: {missing}"


def test_the_test_folders_named_mirror_the_package():
    text = (REPO / "docs" / "development.md").read_text()
    sentence = text[text.index("`tests/` mirrors the package"):].split("(", 1)[1].split(")", 1)[0]
    named = {n.rstrip("/") for n in code_names(sentence) if n.endswith("/")}
    folders = {p.parent.name for p in (REPO / "tests").glob("*/test_*.py")}
    assert named == folders, "docs/development.md: the test folders"


def test_the_map_language_names_every_section_and_rule_key():
    from gguf2ov.maps.schema import TOP_LEVEL_KEYS, rule_keys_table

    text = (REPO / "docs" / "maps.md").read_text()
    language = text[text.index("## The map language"):]
    sections = re.findall(r"^- `(\w+)`:", language, re.MULTILINE)
    assert sorted(sections) == sorted(TOP_LEVEL_KEYS), "docs/maps.md: the map language's sections"
    assert rule_keys_table() in language, f"docs/maps.md: the config rule keys, as RULE_KEYS states them:\n" \
                                          f"{rule_keys_table()}"
