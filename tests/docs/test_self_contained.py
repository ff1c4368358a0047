"""The repository is self-contained: what the code and docs cite, a reader of the repository has.

* No tracked file cites the background documents the project was started from, which do not
  ship: no path into the background folders, none of the background file names
  (:data:`OUTSIDE_NAMES`), no "§N" section number of such a document. Cite a page of
  ``docs/design/`` or the public source instead. This file spells the names in pieces so that
  it names none of them itself.
* Every ``docs/design/<page>.md#<anchor>`` cited anywhere, and every Markdown link into
  ``docs/design/`` or out of it, points at a page that exists and, with an anchor, at a
  heading of that page (GitHub's anchor slugs).
* Every design page is listed in ``docs/design/README.md``.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design"

#: The background documents outside the repository, in pieces (see the module docstring).
OUTSIDE_NAMES = tuple("".join(parts) for parts in (
    ("shared", "/reference"), ("shared", "/seeds"), ("ARCHITECTURE", ".md"), ("style", "-anchors"),
    ("load-", "balancing.md"), ("anchors", "-serving"), ("anchors", "-joint-inference"), ("numbers", ".md"),
    ("field", "-notes"),
))
#: Citations of documents outside the repository.
FORBIDDEN = re.compile("|".join(map(re.escape, OUTSIDE_NAMES)) + r"|\u00a7\s*\d")
#: ``docs/design/<page>.md`` with an optional ``#anchor``, as code comments cite it.
DESIGN_CITATION = re.compile(r"(?<![\w./-])docs/design/([\w.-]+\.md)(?:#([\w-]+))?")
#: Markdown inline links ``[text](target)``.
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_SKIP_DIRS = {"__pycache__", "build", "dist", "demo-report", "runs", "node_modules"}


# --------------------------------------------------------------------------- files

def _walk() -> List[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        out.extend(Path(dirpath) / f for f in filenames)
    return out


@lru_cache(maxsize=1)
def tracked_files() -> Tuple[Path, ...]:
    """Tracked files (``git ls-files``), or every source file when git is unavailable."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        paths = [ROOT / p for p in proc.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = _walk()
    return tuple(sorted(p for p in paths if p.is_file()))


def text_of(path: Path) -> Optional[str]:
    """The file as text, or None for a binary file (a NUL byte in its first 8 KiB)."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def text_files() -> Iterator[Tuple[Path, str]]:
    for path in tracked_files():
        text = text_of(path)
        if text is not None:
            yield path, text


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --------------------------------------------------------------------------- outside references

def outside_references(text: str) -> List[Tuple[int, str]]:
    """(line number, matched text) of every citation of a document outside the repository."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in FORBIDDEN.finditer(line)]


@pytest.mark.parametrize("text", [
    f"see {OUTSIDE_NAMES[0]}/whatever.md",
    f"the articles in /work/{OUTSIDE_NAMES[1]}/",
    f"protobufs ({OUTSIDE_NAMES[2]} rule 2)",
    f"(``{OUTSIDE_NAMES[3]}.md`` practice 10)",
    f"{OUTSIDE_NAMES[4]}, the spec",
    f"{OUTSIDE_NAMES[5]}.md",
    f"{OUTSIDE_NAMES[6]}.md",
    f"{OUTSIDE_NAMES[7]} Table 2",
    f"measured in {OUTSIDE_NAMES[8]}",
    "the spec's \u00a76.3 step 3",  # escaped: this file cites no section itself
    "scenario \u00a7 7(b)",
])
def test_outside_references_are_recognised(text: str) -> None:
    assert outside_references(text), text


@pytest.mark.parametrize("text", [
    "docs/design/balancing.md#slow-start",
    "gRPC Load Balancing on Kubernetes: grpc-load-balancing-on-kubernetes-without-tears",
    "MQTT 5.0 specification, section 4.10",
    "the README's architecture section",
])
def test_public_and_internal_citations_are_allowed(text: str) -> None:
    assert not outside_references(text)


def test_no_file_cites_documents_outside_the_repository() -> None:
    bad = [f"{_rel(path)}:{n}: {hit!r}" for path, text in text_files() for n, hit in outside_references(text)]
    assert not bad, ("cite a section of docs/design/<page>.md or the public source instead of:\n"
                     + "\n".join(bad))


def test_the_scan_covers_the_source_tree() -> None:
    names = {_rel(p) for p in tracked_files()}
    for expected in ("README.md", "cloud/gateway/balancing.py", "edge/spool.py", "docs/design/README.md"):
        assert expected in names


# --------------------------------------------------------------------------- anchors

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation other than
    ``-`` and ``_`` removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(markdown: str) -> Set[str]:
    """Anchors of every ATX heading outside code blocks; a repeated slug gets -1, -2, ..."""
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else ATX.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@lru_cache(maxsize=None)
def page_anchors(page: Path) -> Optional[Set[str]]:
    return anchors_of(page.read_text()) if page.is_file() else None


@pytest.mark.parametrize("heading, anchor", [
    ("Pick: weighted least-connections", "pick-weighted-least-connections"),
    ("Overload is load, not failure", "overload-is-load-not-failure"),
    ("INT8 speed depends on the CPU", "int8-speed-depends-on-the-cpu"),
    ("MQTT v5 request/response", "mqtt-v5-requestresponse"),
    ("Edge: settings (`edge.yaml`)", "edge-settings-edgeyaml"),
    ("`spec.budget`", "specbudget"),
    ("See [the chart](charts/x.yaml) here", "see-the-chart-here"),
    ("snake_case stays", "snake_case-stays"),
])
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_anchors_skip_code_blocks_and_number_repeats() -> None:
    page = "# Title\n\n## Knobs\n\n```sh\n# not a heading\n```\n\n## Knobs\n### Tail ###\n"
    assert anchors_of(page) == {"title", "knobs", "knobs-1", "tail"}


Citation = Tuple[str, int, Path, str]  # (citing file, line, cited page, anchor or "")


def citations() -> Iterator[Citation]:
    """Every reference to a design page: ``docs/design/...`` paths anywhere, and Markdown
    links (relative to the linking file) into ``docs/design/`` or out of a design page."""
    for path, text in text_files():
        is_md = path.suffix == ".md"
        for n, line in enumerate(text.splitlines(), 1):
            for m in DESIGN_CITATION.finditer(line):
                yield _rel(path), n, DESIGN / m.group(1), m.group(2) or ""
            if not is_md:
                continue
            for m in MD_LINK.finditer(line):
                target, _, anchor = m.group(1).partition("#")
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                page = (path.parent / target).resolve() if target else path
                if page.parent == DESIGN or path.parent == DESIGN:
                    yield _rel(path), n, page, anchor


def problems(cites: List[Citation]) -> List[str]:
    out = []
    for where, n, page, anchor in cites:
        anchors = page_anchors(page)
        name = _rel(page) if ROOT in page.parents else str(page)
        if anchors is None and not page.exists():
            out.append(f"{where}:{n}: {name} does not exist")
        elif anchor and page.suffix == ".md" and anchors is not None and anchor not in anchors:
            out.append(f"{where}:{n}: {name} has no heading with anchor #{anchor} "
                       f"(anchors: {', '.join(sorted(anchors))})")
    return out


def test_problems_names_missing_pages_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Slow start\n")
    cites = [("x.py", 1, page, "no-such-section"),
             ("x.py", 2, tmp_path / "no-such-page.md", ""),
             ("x.py", 3, page, "slow-start"),
             ("x.py", 4, page, "")]
    found = problems(cites)
    assert len(found) == 2
    assert "x.py:1:" in found[0] and "#no-such-section" in found[0]
    assert "x.py:2:" in found[1] and "does not exist" in found[1]


def test_code_cites_design_pages() -> None:
    assert sum(1 for c in citations() if c[3]) >= 50


def test_every_cited_design_section_exists() -> None:
    bad = problems(list(citations()))
    assert not bad, "\n".join(bad)


def test_every_design_page_is_indexed() -> None:
    index = (DESIGN / "README.md").read_text()
    missing = [p.name for p in sorted(DESIGN.glob("*.md")) if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"docs/design/README.md does not link {missing}"
