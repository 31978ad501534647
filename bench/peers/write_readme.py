#!/usr/bin/env python3
"""Put bench/out/peers/table.md into bench/peers/README.md between the markers of the section
"Side by side with every peer" (run after run_table.py; the prose around the table is
edited by hand).

A run of some parts only (``run_table.py --skip ...`` or ``--only ...``, e.g. the PSS
column alone) leaves the other cells of its table empty ("–"); those cells, and the
parts of each loader's line under the table that the run did not produce, are kept from
the table already in the README (matched by loader and column header, and by the label
before a part's first ":"), so that a partial run adds its column without erasing the
others.  ``--replace`` writes the new table as it is."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "README.md")
TABLE = os.path.join(os.path.dirname(HERE), "out", "peers", "table.md")
BEGIN, END = "<!-- peers table begin -->", "<!-- peers table end -->"
EMPTY = ("", "–")


def parse(text):
    """(header cells, {loader: {header: cell}}, [loader order], {loader: [parts]})."""
    head, rows, order, details = [], {}, [], {}
    for line in text.strip().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if not head:  # a header may repeat ("CPU-s per M tokens"): keyed by occurrence
                head = [f"{h}#{cells[:i].count(h)}" for i, h in enumerate(cells)]
                continue
            rows[cells[0]] = dict(zip(head, cells))
            order.append(cells[0])
        elif line.startswith("- **"):
            key, rest = line[4:].split("**: ", 1)
            details[key] = [p for p in rest.rstrip(".").split("; ") if p]
    return head, rows, order, details


def label(part):
    return part.split(":", 1)[0]


def merge(old, new):
    ohead, orows, oorder, odet = parse(old)
    nhead, nrows, norder, ndet = parse(new)
    lines = ["| " + " | ".join(h.rsplit("#", 1)[0] for h in nhead) + " |",
             "|" + "---|" * len(nhead)]
    for key in norder + [k for k in oorder if k not in nrows]:
        n, o = nrows.get(key, {}), orows.get(key, {})
        cells = [n.get(h) if n.get(h) not in EMPTY + (None,) else o.get(h, n.get(h, "–"))
                 for h in nhead]
        cells[0] = key
        lines.append("| " + " | ".join(c if c else "" for c in cells) + " |")
    out = []
    for key in norder + [k for k in oorder if k not in nrows]:
        parts = list(odet.get(key, []))
        for p in ndet.get(key, []):
            same = [i for i, q in enumerate(parts) if label(q) == label(p)]
            if same:
                parts[same[0]] = p
            else:
                parts.append(p)
        if parts:
            out.append(f"- **{key}**: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n\n" + "\n".join(out) + "\n"


def main():
    text = open(README).read()
    table = open(TABLE).read()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    if "--replace" not in sys.argv:
        table = merge(text[a:b], table)
    with open(README, "w") as f:
        f.write(text[:a] + "\n" + table + text[b:])


if __name__ == "__main__":
    main()
