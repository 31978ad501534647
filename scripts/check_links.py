#!/usr/bin/env python3
"""Check that every relative link in the project's documents resolves.

Scans README.md, CONTRIBUTING.md, src/README.md and every Markdown file under docs/ and bench/
for inline links and images (`[text](target)`, `![alt](target)`).  A link to another
site (`http:`, `https:`, `mailto:`) is left alone.  A relative target must name an
existing file or directory, relative to the document; a `#fragment` must match a heading
of the target document (GitHub's anchor rule: lower case, punctuation dropped, spaces to
hyphens).

    python scripts/check_links.py            # prints each broken link; exit 1 if any
    python scripts/check_links.py FILE...    # only these documents
"""
from __future__ import annotations

import os
import re
import sys
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md", "CONTRIBUTING.md", "bench", "docs", "src/README.md"]

# Documents that other work adds (the config key table is generated from the C key
# table; the balancing guide comes with the balancer that it describes).  A link to one
# is accepted while it is missing; once the file exists it is checked like any other.
PENDING: set = set()

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def documents(paths: Iterable[str]) -> List[str]:
    out = []
    for p in paths:
        full = os.path.join(ROOT, p)
        if os.path.isdir(full):
            for d, dirs, files in os.walk(full):
                # virtual environments and raw benchmark output are not documents
                dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "out")
                out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
        elif os.path.exists(full):
            out.append(full)
    return sorted(out)


def strip_code(text: str) -> List[Tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, re.sub(r"`[^`]*`", "", line)))
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    h = re.sub(r"`([^`]*)`", r"\1", heading)
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = h.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


_anchor_cache: Dict[str, Set[str]] = {}


def anchors(path: str) -> Set[str]:
    if path not in _anchor_cache:
        seen: Dict[str, int] = {}
        out = set()
        for _, heading in _headings(path):
            a = anchor(heading)
            k = seen.get(a, 0)
            out.add(a if k == 0 else f"{a}-{k}")
            seen[a] = k + 1
        _anchor_cache[path] = out
    return _anchor_cache[path]


def _headings(path: str) -> List[Tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out, fenced = [], False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append((n, m.group(2)))
    return out


def check_link(doc: str, target: str) -> Optional[str]:
    """None when the link resolves, else why not."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
        return None
    path, _, frag = target.partition("#")
    if path:
        full = os.path.normpath(os.path.join(os.path.dirname(doc), path))
    else:
        full = doc
    rel = os.path.relpath(full, ROOT)
    if not os.path.exists(full):
        if rel in PENDING:
            return None
        return f"{rel} does not exist"
    inside = doc.startswith(ROOT + os.sep)
    if path and inside and not full.startswith(ROOT + os.sep) and full != ROOT:
        return f"{target} points outside the repository"
    if frag and full.endswith(".md") and os.path.isfile(full):
        if frag not in anchors(full):
            return f"no heading #{frag} in {rel}"
    return None


def check(paths: Iterable[str] = DOCUMENTS) -> List[str]:
    """Every broken link, as 'file:line: target: why'."""
    errors = []
    for doc in documents(paths):
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        for n, line in strip_code(text):
            for m in LINK.finditer(line):
                why = check_link(doc, m.group(1))
                if why:
                    errors.append(f"{os.path.relpath(doc, ROOT)}:{n}: {m.group(1)}: {why}")
    return errors


def main(argv: List[str]) -> int:
    errors = check(argv or DOCUMENTS)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} broken link(s)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
