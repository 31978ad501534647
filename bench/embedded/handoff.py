#!/usr/bin/env python3
"""Hand-off: the embedded C loader against the 2-core limit of the same work.

For each config (`throughput`: bench/embedded/throughput.py's, 2 x 2048 micro-batches, dp 4;
`large-mb`: the same with 8 x 8192, global batch 128), each round runs
`build-bench/bench_handoff CONFIG SECONDS THREADS...` (bench/embedded/handoff.c): first the limit
(2 threads running the loader's own builder, pl__construct, on pre-planned micro-batches:
the SPEC fields from the uint16 tokens into one reused buffer each; no hand-off, no
planning), then the loader with `threads` 1, 2, 3 and 4 serving every
rank to one consumer.  Rounds repeat (`--rounds`), medians reported; ratios are
loader / limit of the same round.  Each round also gives the limit's threads'
work with the planner's CPU per token added (`limit_with_planning`: the planner
timed on the same plans; what the loader does, without its hand-off), and, with
`--cold-buffers N`, the limit writing N buffers in turn (the loader's buffers in
flight: cold memory, as the loader writes it), so that loader / that figure is
what the hand-off itself leaves.

Usage: .venv/bin/python bench/embedded/handoff.py [--seconds 5] [--rounds 3] [--cold-buffers 48] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import OUT, ROOT  # noqa: E402
import results as bench_results  # noqa: E402
from python_overhead import large_mb_config  # noqa: E402
from throughput import write_polyload_config  # noqa: E402

BIN = os.path.join(ROOT, "build-bench", "bench_handoff")


def build():
    subprocess.run(["cmake", "-S", ROOT, "-B", os.path.join(ROOT, "build-bench"), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", os.path.join(ROOT, "build-bench")], check=True,
                   stdout=subprocess.DEVNULL)
    # bench/embedded/handoff.c is a CMake target (PL_BUILD_BENCH), linked with every dependency of
    # the static library.
    subprocess.run(["cmake", "--build", os.path.join(ROOT, "build-bench"), "--target",
                    "bench_handoff"], check=True, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2,3,4")
    ap.add_argument("--configs", default="throughput,large-mb")
    ap.add_argument("--cold-buffers", type=int, default=0,
                    help="also run the limit cycling this many buffers (0: not)")
    ap.add_argument("--json")
    args = ap.parse_args()
    build()
    base = write_polyload_config(1000000)
    configs = {"throughput": base, "large-mb": large_mb_config(base)}
    threads = args.threads.split(",")
    result = {}
    for name in args.configs.split(","):
        rounds = []
        for _ in range(args.rounds):
            out = subprocess.run([BIN, os.path.join(ROOT, configs[name]), str(args.seconds)]
                                 + threads, check=True, capture_output=True, text=True,
                                 cwd=ROOT).stdout
            rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            lim = next(r for r in rows if r["what"] == "limit")
            limit = lim["tokens_per_s"]
            loader = {r["threads"]: r["tokens_per_s"] for r in rows if r["what"] == "loader"}
            rnd = {"limit": limit, "loader": loader,
                   "ratio": {t: v / limit for t, v in loader.items()},
                   "plan_cpu_ns_per_token": lim["plan_cpu_ns_per_token"],
                   "limit_with_planning": lim["limit_with_planning_tokens_per_s"]}
            rnd["ratio_with_planning"] = {t: v / rnd["limit_with_planning"]
                                          for t, v in loader.items()}
            if args.cold_buffers:
                out = subprocess.run([BIN, os.path.join(ROOT, configs[name]),
                                      str(args.seconds), "--limit-buffers",
                                      str(args.cold_buffers)], check=True,
                                     capture_output=True, text=True, cwd=ROOT).stdout
                cold = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
                rnd["cold_limit_with_planning"] = cold["limit_with_planning_tokens_per_s"]
                rnd["ratio_cold_with_planning"] = {
                    t: v / rnd["cold_limit_with_planning"] for t, v in loader.items()}
            rounds.append(rnd)
            print(name, json.dumps(rounds[-1]), flush=True)
        med = {"limit": statistics.median(r["limit"] for r in rounds),
               "limit_with_planning": statistics.median(r["limit_with_planning"]
                                                        for r in rounds)}
        for t in rounds[0]["loader"]:
            med[f"loader_t{t}"] = statistics.median(r["loader"][t] for r in rounds)
            for k in ("ratio", "ratio_with_planning", "ratio_cold_with_planning"):
                if k in rounds[0]:
                    med[f"{k}_t{t}"] = statistics.median(r[k][t] for r in rounds)
        print(name, "median", json.dumps(med), flush=True)
        result[name] = {"config": configs[name], "rounds": rounds, "median": med}
    if args.json:
        os.makedirs(OUT, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    figures = []
    for name, shape in (("throughput", "2 x 2048"), ("large-mb", "8 x 8192")):
        med = result.get(name, {}).get("median", {})
        if "ratio_t2" in med:
            figures.append(bench_results.record(
                f"embedded loader / 2-core limit of its own builder, {shape} micro-batches",
                round(100 * med["ratio_t2"], 1), "%",
                note=f"2 loader threads, median of {args.rounds} rounds"))
    if figures:
        print(bench_results.write("embedded_handoff", figures))


if __name__ == "__main__":
    main()
