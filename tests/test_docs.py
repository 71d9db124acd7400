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


def test_the_map_language_names_every_section_and_rule_key():
    from gguf2ov.maps.schema import TOP_LEVEL_KEYS, rule_keys_table

    text = (REPO / "docs" / "maps.md").read_text()
    language = text[text.index("## The map language"):]
    sections = re.findall(r"^- `(\w+)`:", language, re.MULTILINE)
    assert sorted(sections) == sorted(TOP_LEVEL_KEYS), "docs/maps.md: the map language's sections"
    assert rule_keys_table() in language, f"docs/maps.md: the config rule keys, as RULE_KEYS states them:\n" \
                                          f"{rule_keys_table()}"
