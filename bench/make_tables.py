"""Generate the figures tables from bench/results/*.json.

Two places hold generated tables, each between a pair of markers:

- bench/README.md, `<!-- results tables begin -->` ... `<!-- results tables end -->`:
  one table per results file, every figure with its command, machine, date and commit;
- README.md, `<!-- figures begin -->` ... `<!-- figures end -->`: the headline figures
  (records with `"headline": true`).

    python bench/make_tables.py           # rewrite both
    python bench/make_tables.py --check   # exit 1 if either is out of date
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import results  # noqa: E402

BENCH_README = os.path.join(ROOT, "bench", "README.md")
README = os.path.join(ROOT, "README.md")
BENCH_MARKERS = ("<!-- results tables begin -->", "<!-- results tables end -->")
README_MARKERS = ("<!-- figures begin -->", "<!-- figures end -->")

# Subjects in reading order; a results file's name starts with its subject.
SUBJECTS = [("embedded", "Embedded loader (`bench/embedded/`)"),
            ("balance", "Balancing and planning (`bench/balance/`)"),
            ("text", "Raw text sources (`bench/text/`)"),
            ("image", "Image-text sources (`bench/images/`)"),
            ("ray", "Ray deployment (`bench/ray/`)"),
            ("remote", "Object storage (`bench/remote/`)"),
            ("peers", "Side by side with every peer (`bench/peers/`)")]


def load_all() -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(results.RESULTS, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            recs = json.load(f)
        results.check(recs, path)
        out[name] = recs
    return out


def fmt(v: float) -> str:
    """A figure as a reader writes it: 4.05e8, 0.051, 880, 1.00004."""
    if v == 0:
        return "0"
    if abs(v) >= 1e5:
        m, e = f"{v:.3g}".split("e")
        return f"{m}e{int(e)}"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.6g}"


def ratio(r: dict) -> str:
    if "peer_value" not in r or not r["peer_value"] or not r["value"]:
        return "–"
    x = r["peer_value"] / r["value"] if r.get("lower_is_better") else r["value"] / r["peer_value"]
    return f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x"


def cell(s: str) -> str:
    return s.replace("|", "\\|")


def amount(v: float, unit: str) -> str:
    """A value with its unit: 880 B, 1.001x, 4.5 % of step."""
    return f"{fmt(v)}x" if unit == "x" else f"{fmt(v)} {unit}"


def peer(r: dict) -> str:
    if "peer" not in r:
        return "–"
    if "peer_value" in r:
        return cell(f"{r['peer']}: {amount(r['peer_value'], r['unit'])}")
    return cell(r["peer"])


def subject_of(name: str) -> int:
    for i, (prefix, _) in enumerate(SUBJECTS):
        if name.startswith(prefix):
            return i
    return len(SUBJECTS)


def bench_tables(data: dict) -> str:
    lines = []
    names = sorted(data, key=lambda n: (subject_of(n), n))
    current = None
    for name in names:
        s = subject_of(name)
        if s != current:
            current = s
            title = SUBJECTS[s][1] if s < len(SUBJECTS) else "Other"
            lines += ["", f"### {title}"]
        lines += ["", f"`bench/results/{name}.json`", "",
                  "| figure | value | compared with | ratio | measured | command |",
                  "|---|---|---|---|---|---|"]
        for r in data[name]:
            note = f" ({cell(r['note'])})" if r.get("note") else ""
            m = r["machine"]
            lines.append(f"| {cell(r['figure'])}{note} | {amount(r['value'], r['unit'])} | {peer(r)} "
                         f"| {ratio(r)} | {r['date']}, {cell(m['cpu'])}, {m['cores']} cores, "
                         f"`{r['commit']}` | `{cell(r['command'])}` |")
    return "\n".join(lines[1:]) + "\n"


def readme_table(data: dict) -> str:
    lines = ["| what | polyload | compared with | ratio | measured |", "|---|---|---|---|---|"]
    for name in sorted(data, key=lambda n: (subject_of(n), n)):
        for r in data[name]:
            if not r.get("headline"):
                continue
            lines.append(f"| {cell(r['figure'])} | {amount(r['value'], r['unit'])} | {peer(r)} "
                         f"| {ratio(r)} | {r['date']}, [`{name}`](bench/results/{name}.json) |")
    return "\n".join(lines) + "\n"


def splice(text: str, markers: tuple, body: str, path: str) -> str:
    begin, end = markers
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: markers {begin} ... {end} not found")
    return text[:i + len(begin)] + "\n" + body + text[j:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a table is out of date")
    a = ap.parse_args()
    data = load_all()
    stale = []
    for path, markers, body in ((BENCH_README, BENCH_MARKERS, bench_tables(data)),
                                (README, README_MARKERS, readme_table(data))):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = splice(old, markers, body, path)
        if new != old:
            if a.check:
                stale.append(os.path.relpath(path, ROOT))
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if stale:
        print("out of date (run python bench/make_tables.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
