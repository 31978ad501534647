"""Benchmark results as data: every benchmark writes bench/results/<name>.json.

A results file is a JSON list of records, one per figure:

    {"figure": "tokens/s into a PyTorch loop", "value": 2.95e7, "unit": "tokens/s",
     "command": ".venv/bin/python bench/embedded/torch_loop.py", "date": "2026-12-01",
     "machine": {"cpu": "AMD EPYC ...", "cores": 2}, "commit": "b03a8af",
     "headline": true, "peer": "megatron-core DataLoader, 2 workers", "peer_value": 1.31e6,
     "note": "..."}

`figure`, `value`, `unit`, `command`, `date`, `machine` and `commit` are always there;
`headline` marks the figures of the README's table; `peer`/`peer_value` give the
compared system's figure when there is one (`lower_is_better` says which way the ratio
goes), `note` what a reader must know to read it.  `commit` is the commit measured; for
figures recorded before the results files existed, the commit that first recorded them.
A benchmark calls `write(name, records)` at its end; records whose figure it measured
again replace the old ones, the others stay.  `bench/make_tables.py` turns the files into
the tables of bench/README.md and README.md.

From a shell (for the C benchmarks):

    python bench/results.py NAME FIGURE VALUE UNIT --command CMD [--headline]
        [--lower-is-better] [--note NOTE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# BENCH_RESULTS=DIR sends a trial run's records elsewhere (the committed files stay).
RESULTS = os.environ.get("BENCH_RESULTS") or os.path.join(ROOT, "bench", "results")
REQUIRED = ("figure", "value", "unit", "command", "date", "machine", "commit")
OPTIONAL = ("headline", "peer", "peer_value", "lower_is_better", "note")


def machine() -> dict:
    """The CPU model and core count of this machine."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


def git_commit() -> str:
    """The short commit of the working tree, with "+dirty" when it has changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def this_command() -> str:
    """The command line that runs this process, relative to the repository root."""
    argv = list(sys.argv)
    if argv and os.path.isabs(argv[0]) and argv[0].startswith(ROOT + os.sep):
        argv[0] = os.path.relpath(argv[0], ROOT)
    exe = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else "python"
    return " ".join([exe] + argv)


def record(figure: str, value: float, unit: str, *, command: str | None = None,
           **extra) -> dict:
    """One figure of this run, with the command, machine, date and commit filled in."""
    unknown = set(extra) - set(OPTIONAL)
    if unknown:
        raise ValueError(f"unknown record fields {sorted(unknown)}")
    r = {"figure": figure, "value": value, "unit": unit,
         "command": command or this_command(), "date": time.strftime("%Y-%m-%d"),
         "machine": machine(), "commit": git_commit()}
    r.update({k: v for k, v in extra.items() if v is not None})
    return r


def check(records: list, where: str = "records") -> None:
    """Raise ValueError unless records is a list of complete records."""
    if not isinstance(records, list):
        raise ValueError(f"{where}: not a list")
    for i, r in enumerate(records):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"{where}[{i}]: missing {missing}")
        unknown = set(r) - set(REQUIRED) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"{where}[{i}]: unknown fields {sorted(unknown)}")
        if not isinstance(r["value"], (int, float)) or isinstance(r["value"], bool):
            raise ValueError(f"{where}[{i}]: value is not a number")


def load(name: str) -> list:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        records = json.load(f)
    check(records, path)
    return records


def write(name: str, records: list) -> str:
    """Merge records into bench/results/NAME.json (same figure: replaced); return the path."""
    check(records, name)
    new = {r["figure"] for r in records}
    merged = [r for r in load(name) if r["figure"] not in new] + list(records)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description="Add one figure to bench/results/NAME.json.")
    ap.add_argument("name")
    ap.add_argument("figure")
    ap.add_argument("value", type=float)
    ap.add_argument("unit")
    ap.add_argument("--command", required=True, help="the command that measured it")
    ap.add_argument("--headline", action="store_true")
    ap.add_argument("--lower-is-better", action="store_true")
    ap.add_argument("--note")
    a = ap.parse_args()
    print(write(a.name, [record(a.figure, a.value, a.unit, command=a.command,
                                headline=a.headline or None, note=a.note,
                                lower_is_better=a.lower_is_better or None)]))


if __name__ == "__main__":
    main()
