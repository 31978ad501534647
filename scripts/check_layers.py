#!/usr/bin/env python3
"""Check that calls between the role folders of src/ point down only.

src/README.md ranks the folders, lowest first:

    common < config < source < planner < wire < build < runtime

A file may call into its own folder and the folders below it.  This script
reads the library's object files (src/<folder>/.../*.o under the object
library's directory, by default build/CMakeFiles/polyload_obj.dir), asks
``nm`` which symbols each one defines and which it leaves undefined, and maps
every undefined symbol that another of the library's objects defines (``pl_``
public functions and ``pl__`` internals alike) to the defining folder.  It
prints, with counts:

  * the folder-to-folder map (how many symbols each folder takes from each
    other folder),
  * every upward reference (object, symbol, the folder that defines it),
  * every pair of folders that call each other,
  * pairs of files within one folder that call each other (information only).

It exits with 1 when there is an upward reference or a pair of folders
calling each other (with the ranking, the second implies the first), else 0;
2 when the objects cannot be read.  ``--json`` prints the findings as JSON.

Usage: scripts/check_layers.py [--objdir DIR] [--nm NM] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict

# Lowest first; an arrow from a folder to one of a higher rank points up.
RANKS = ["common", "config", "source", "planner", "wire", "build", "runtime"]


def object_files(objdir: str) -> list[tuple[str, str]]:
    """(folder, path relative to src/) of every object under objdir/src."""
    src = os.path.join(objdir, "src")
    out = []
    for root, _dirs, files in os.walk(src):
        for f in files:
            if not f.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            folder = rel.split(os.sep)[0] if os.sep in rel else ""
            out.append((folder, rel))
    return sorted(out, key=lambda t: t[1])


def read_symbols(nm: str, path: str) -> tuple[set[str], set[str]]:
    """(defined global symbols, undefined symbols) of one object file."""
    r = subprocess.run([nm, "-P", path], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper() or kind in ("w", "v"):
            defined.add(name)
    return defined, undefined


def analyze(objs: dict[str, tuple[str, set[str], set[str]]]) -> dict:
    """objs: relative path -> (folder, defined, undefined).  Returns findings."""
    owner: dict[str, str] = {}
    for rel, (_folder, defined, _u) in objs.items():
        for s in defined:
            owner.setdefault(s, rel)
    # Symbols are ours when a library object defines them and they are named
    # as ours; libc, libyaml and the C++ runtime are not arrows.
    edges = defaultdict(set)  # (from folder, to folder) -> {(file, symbol)}
    file_edges = defaultdict(set)  # (from file, to file) -> {symbol}
    for rel, (folder, _d, undefined) in objs.items():
        for s in undefined:
            if not s.startswith("pl_") or s not in owner:
                continue
            to_rel = owner[s]
            to_folder = objs[to_rel][0]
            file_edges[(rel, to_rel)].add(s)
            if to_folder != folder:
                edges[(folder, to_folder)].add((rel, s))

    def rank(f: str) -> int:
        return RANKS.index(f) if f in RANKS else -1

    upward = []
    unknown = sorted({f for f, _ in edges} | {t for _, t in edges} if edges else set())
    unknown = [f for f in unknown if f not in RANKS]
    for (a, b), refs in sorted(edges.items()):
        if a in RANKS and b in RANKS and rank(b) > rank(a):
            for rel, s in sorted(refs):
                upward.append({"from": rel, "symbol": s, "defined_in": owner[s],
                               "from_folder": a, "to_folder": b})
    mutual = sorted({tuple(sorted((a, b))) for (a, b) in edges if (b, a) in edges})
    mutual_files = sorted(
        {tuple(sorted((a, b))) for (a, b) in file_edges
         if a != b and (b, a) in file_edges and objs[a][0] == objs[b][0]})
    return {
        "objects": len(objs),
        "folder_map": {f"{a} -> {b}": len(v) for (a, b), v in sorted(edges.items())},
        "upward": upward,
        "mutual_folders": [list(p) for p in mutual],
        "mutual_files": [
            {"files": list(p),
             "symbols": sorted(file_edges[(p[0], p[1])] | file_edges[(p[1], p[0])])}
            for p in mutual_files],
        "unranked_folders": unknown,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objdir", default="build/CMakeFiles/polyload_obj.dir",
                    help="the object library's directory (holds src/<folder>/*.o)")
    ap.add_argument("--nm", default=os.environ.get("NM", "nm"))
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    a = ap.parse_args(argv)

    files = object_files(a.objdir)
    if not files:
        print(f"check_layers: no object files under {a.objdir}/src (build first)",
              file=sys.stderr)
        return 2
    objs = {}
    for folder, rel in files:
        try:
            d, u = read_symbols(a.nm, os.path.join(a.objdir, "src", rel))
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"check_layers: {a.nm} failed on {rel}: {e}", file=sys.stderr)
            return 2
        objs[rel] = (folder, d, u)
    res = analyze(objs)
    bad = bool(res["upward"] or res["mutual_folders"] or res["unranked_folders"])
    if a.json:
        print(json.dumps(res, indent=1))
        return 1 if bad else 0

    print(f"{res['objects']} objects; folders ranked {' < '.join(RANKS)}")
    print("folder map (symbols taken from another folder):")
    for k, n in res["folder_map"].items():
        print(f"  {k}: {n}")
    print(f"upward references: {len(res['upward'])}")
    for u in res["upward"]:
        print(f"  {u['from']} -> {u['symbol']} ({u['defined_in']})")
    print(f"folders calling each other: {len(res['mutual_folders'])}")
    for a_, b_ in res["mutual_folders"]:
        print(f"  {a_} <-> {b_}")
    if res["unranked_folders"]:
        print(f"folders not in the ranking: {', '.join(res['unranked_folders'])}")
    print(f"files calling each other within a folder (information): "
          f"{len(res['mutual_files'])}")
    for m in res["mutual_files"]:
        print(f"  {m['files'][0]} <-> {m['files'][1]}: {', '.join(m['symbols'])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
