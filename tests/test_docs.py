"""The README stays short and every link in the documentation leads somewhere: README.md is at
most 300 lines, none of them longer than 200 characters; every relative link in README.md and
docs/*.md names a file that exists and, for `page.md#anchor`, a heading of that page (GitHub's
slugs); and every path the README's "Where does X live" map names exists."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 300
MAX_LINE_CHARS = 200
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
TOP_LEVEL = ("cli", "controlplane", "node_agent", "trainyard", "runners", "sim", "bench", "harness")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    kept = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces as
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, a repeated one suffixed -1, -2... as GitHub does."""
    seen: Counter[str] = Counter()
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = re.match(r"#{1,6} (.*)", line)
        if match and not fenced:
            base = slug(match.group(1))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES
    long = [number for number, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert long == []


def test_the_readme_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert [line.split("#")[0].strip() for line in block] == ["./dev up", "./dev test"]


def test_every_relative_link_leads_to_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_readmes_map_names_paths_that_exist() -> None:
    text = README.read_text()
    section = text.split("## Where does X live", 1)[1].split("\n## ", 1)[0]
    paths = {
        path
        for path in re.findall(r"`([\w./-]+)`", section)
        if path.split("/")[0] in TOP_LEVEL or path.startswith("tests/")
    }
    assert paths
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []
