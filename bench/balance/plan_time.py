#!/usr/bin/env python3
"""Planning time per step at scale: `imbalance --plan-time` (dp 512, 4096 sequences of
16k tokens, one thread, the synthetic lognormal source) for one source, 2,000 sources of
5 weights and 2,000 sources of distinct weights; the thread CPU median of each goes to
bench/results/balance_planning.json.

    .venv/bin/python bench/balance/make_synthetic.py \\
        --out data/synthetic/lognormal_text_document --documents 2200000   # once
    cmake --build build-bench --target imbalance
    .venv/bin/python bench/balance/plan_time.py [--bin build-bench/imbalance] [--steps 10]
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402

CASES = [(1, "cycle", "1 source"), (2000, "cycle", "2,000 sources of 5 weights"),
         (2000, "distinct", "2,000 distinct weights")]
CPU = re.compile(r"thread CPU median ([0-9.]+) ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join("build-bench", "imbalance"))
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    figures = []
    for n, weights, what in CASES:
        cmd = [a.bin, "--plan-time", "--steps", str(a.steps), "--sources", str(n),
               "--weights", weights, "--balance", "none"]
        out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
        print(out.strip(), flush=True)
        ms = float(CPU.search(out).group(1))
        figures.append(bench_results.record(
            f"planning per step, dp 512, 4096 x 16k tokens, one core, {what}", ms, "ms",
            command=" ".join(cmd), lower_is_better=True,
            headline=True if weights == "distinct" else None,
            note=f"thread CPU, median of {a.steps} steps"))
    print(bench_results.write("balance_planning", figures))


if __name__ == "__main__":
    main()
