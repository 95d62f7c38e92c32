"""The repository explains itself: no file cites a document outside it, and every relative link in the
docs points to a file that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("pfl", "conf", "docs", "bench", "README.md", "CONTRIBUTING.md")
LINKED = ("docs/*.md", "README.md", "CONTRIBUTING.md")

# Documents a user does not have: the place where a formula or convention is stated must be in the
# repository (docs/algorithms.md) or be the paper and its authors' public code.
OUTSIDE = {
    "ALGORITHMS.md": re.compile(r"ALGORITHMS\.md"),
    "DESIGN.md": re.compile(r"DESIGN\.md"),
    "a path outside the repository": re.compile(r"(?:\.\./)+shared\b|/work/|shared/papers"),
    "a paper by file number": re.compile(r"\bpapers? 00\d\b"),
}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def tracked(*patterns: str) -> list[Path]:
    """Files under ``patterns`` that git tracks (every file there when git is unavailable)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        found = [p for pat in patterns for p in ROOT.glob(pat if "*" in pat else f"{pat}/**/*")]
        found += [ROOT / p for p in patterns if (ROOT / p).is_file()]
        return [p for p in found if p.is_file() and "__pycache__" not in p.parts]


def outside_references(path: Path) -> list[tuple[str, int, str]]:
    """(what, line number, line) of every mention of a document outside the repository."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    return [
        (what, n, line.strip())
        for n, line in enumerate(text.splitlines(), 1)
        for what, pattern in OUTSIDE.items()
        if pattern.search(line)
    ]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative markdown links of ``path`` (outside code) whose target file does not exist."""
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        file = (path.parent / target.split("#", 1)[0]).resolve()
        if not file.exists() or root not in file.parents:
            out.append(target)
    return out


def test_no_file_cites_a_document_outside_the_repository():
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {what}: {line}"
        for path in tracked(*SCANNED)
        for what, n, line in outside_references(path)
    ]
    assert not hits, "cite docs/algorithms.md, the paper or the authors' code instead:\n" + "\n".join(hits)


def test_every_relative_link_in_the_docs_exists():
    pages = tracked(*LINKED)
    assert any(p.name == "algorithms.md" for p in pages)
    broken = [f"{p.relative_to(ROOT)}: {target}" for p in pages for target in broken_links(p)]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_the_docs_index_lists_every_page_and_the_readme_links_it():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {Path(target.split("#", 1)[0]).name for target in LINK.findall(index)}
    unlisted = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and p.name not in listed)
    assert not unlisted, f"add {unlisted} to docs/README.md"
    assert "(docs/README.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("see ALGORITHMS.md for the rule", "ALGORITHMS.md"),
        ("# as in DESIGN.md", "DESIGN.md"),
        ("read ../../shared/papers/x.txt", "a path outside the repository"),
        ("FedPG (paper 000), Table 1", "a paper by file number"),
    ],
)
def test_outside_references_are_found(tmp_path, line, what):
    path = tmp_path / "x.md"
    path.write_text(f"fine\n{line}\n")
    assert (what, 2) in [(w, n) for w, n, _ in outside_references(path)]


def test_broken_links_are_found_and_code_is_ignored(tmp_path):
    (tmp_path / "there.md").write_text("x")
    (tmp_path / "page.md").write_text(
        "[ok](there.md#part) [web](https://example.org/x.md) [anchor](#top) [gone](missing.md)\n"
        "`[code](inline.md)`\n```\n[fenced](fenced.md)\n```\n"
    )
    assert broken_links(tmp_path / "page.md", root=tmp_path) == ["missing.md"]
