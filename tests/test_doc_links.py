"""Every relative link in README.md and docs/*.md points to a file or folder that exists.

Checks inline links and images (``[text](path)``, ``![alt](path)``), reference definitions
(``[name]: path``) and HTML ``src=`` / ``href=`` attributes, outside code blocks and code spans.
Links with a scheme (``https:``, ``mailto:``) and links to an anchor of the same page (``#...``) are
left alone; a ``#fragment`` after a path is dropped before the path is checked.

Needs only the standard library and pytest, not the compiled extension; on a machine without it run
``python -m pytest --noconftest tests/test_doc_links.py`` (tests/conftest.py imports flashattn), or
``python tests/test_doc_links.py``, which prints the dead links.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Tuple
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def documents() -> List[Path]:
    """README.md and every markdown file directly under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def link_targets(text: str) -> List[Tuple[int, str]]:
    """(line number, target) of every link in a markdown text, code blocks and code spans excluded."""
    targets = []
    in_fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            marker = fence.group(1)
            if in_fence is None:
                in_fence = marker
            elif marker == in_fence:
                in_fence = None
            continue
        if in_fence is not None:
            continue
        line = CODE_SPAN.sub("", line)
        found = [m.group(1) for m in INLINE_LINK.finditer(line)]
        found += [m.group(1) for m in REFERENCE_DEF.finditer(line)]
        found += [m.group(1) for m in HTML_ATTR.finditer(line)]
        targets += [(number, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for t in found]
    return targets


def is_relative(target: str) -> bool:
    return bool(target) and not target.startswith("#") and not target.startswith("//") \
        and not SCHEME.match(target)


def dead_links(document: Path) -> List[str]:
    """'line N: target' for each relative link of `document` whose file or folder does not exist."""
    dead = []
    for number, target in link_targets(document.read_text(encoding="utf-8")):
        if not is_relative(target):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not path:
            continue
        resolved = (document.parent / path) if not path.startswith("/") else (ROOT / path.lstrip("/"))
        if not resolved.exists():
            dead.append(f"line {number}: {target}")
    return dead


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    dead = dead_links(document)
    assert not dead, f"{document.relative_to(ROOT)} links to files that do not exist:\n" + "\n".join(dead)


def test_documents_have_links():
    # A parser that found nothing would pass the test above vacuously.
    assert any(link_targets((ROOT / "README.md").read_text(encoding="utf-8")))


def test_dead_link_is_reported(tmp_path):
    (tmp_path / "present.md").write_text("x\n")
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "chart.png").write_bytes(b"")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[kept](present.md) and [kept too](present.md#section) ![chart](img/chart.png)\n"
        "[gone](missing.md) and ![gone too](img/missing.png \"title\")\n"
        "[web](https://example.com/x.md) [anchor](#top) `[code](not-a-link.md)`\n"
        "```\n[fenced](also-not-a-link.md)\n```\n"
        "[ref]: missing_ref.md\n"
        '<img src="img/missing.svg">\n'
    )
    assert dead_links(doc) == [
        "line 2: missing.md",
        "line 2: img/missing.png",
        "line 7: missing_ref.md",
        "line 8: img/missing.svg",
    ]


if __name__ == "__main__":
    problems = [f"{d.relative_to(ROOT)} {entry}" for d in documents() for entry in dead_links(d)]
    print("\n".join(problems) or "every relative link resolves")
    sys.exit(1 if problems else 0)
