#!/usr/bin/env python3
"""The image-text table of bench/peers/README.md ("Image-text peers"): polyload, Megatron-Energon
and WebDataset on the same two photo-caption sources, each harness in its own venv and a
fresh process per measurement (bench/peers/vlm_common.py says what is measured).

    .venv/bin/python bench/peers/run_vlm_table.py [--rounds 3] [--seconds 4] [--readme]

Makes the venvs (bench/peers/setup_venvs.sh energon webdataset) and data/vlm_bench
(scripts/make_vlm_corpus.py --tile 4 --per-shard 32) when missing, writes each peer's data
(its prepare mode), then: ``--rounds`` rounds of throughput (every loader once per round,
the order rotating; polyload's images/s over the peer's of the same round, median),
start to first batch (3 runs each, interleaved, median), mixture (30 steps) and resume
(K = 24 micro-batches, the next 20 compared).  Results: bench/out/vlm_peers/results.json
and table.md; --readme puts the table into bench/peers/README.md between its markers.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "bench", "out", "vlm_peers")
VENVS = os.path.join(HERE, ".venvs")
PEERS = {
    "polyload": (os.path.join(ROOT, ".venv", "bin", "python"), "peer_vlm_polyload.py"),
    "energon": (os.path.join(VENVS, "energon", "bin", "python"), "peer_energon.py"),
    "webdataset": (os.path.join(VENVS, "webdataset", "bin", "python"), "peer_webdataset.py"),
}
BEGIN, END = "<!-- vlm peers table begin -->", "<!-- vlm peers table end -->"


def run(name, *args, timeout=600):
    py, script = PEERS[name]
    p = subprocess.run([py, os.path.join(HERE, script), *args], capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["rc %d" % p.returncode])[-1]}
    return json.loads(lines[-1])


def setup():
    if not os.path.exists(os.path.join(ROOT, "data", "vlm_bench", "shard-000004.tar")):
        subprocess.run([PEERS["polyload"][0], os.path.join(ROOT, "scripts",
                        "make_vlm_corpus.py"), "--out", os.path.join(ROOT, "data",
                        "vlm_bench"), "--tile", "4", "--per-shard", "32"], check=True)
    subprocess.run(["sh", os.path.join(HERE, "setup_venvs.sh"), "energon", "webdataset"],
                   check=True)


def fmt(x, d=3):
    return f"{x:.{d}g}" if isinstance(x, float) else str(x)


def table(res):
    rows = ["| loader | data, written by | mixture as the peer expresses it | images/s into "
            "the loop (polyload ÷ peer) | CPU-s per 1,000 images (peer ÷ polyload) | start to "
            "first batch | "
            "mixture error per step, max tokens (÷ step tokens; cumulative) | realized "
            "mixture (for 0.7/0.3 of tokens) | exact mid-epoch resume, next 20 "
            "micro-batches |", "|---|---|---|---|---|---|---|---|---|"]
    desc = {
        "polyload": ("the shards as they are (`make_vlm_corpus.py`, tarfile)",
                     "token weights 0.7/0.3 (`weight:`), packed into 2 x 2048"),
        "energon": ("webdataset `ShardWriter` + `energon prepare` (CrudeWebdataset)",
                    "`MetadatasetV2` `blend:` sample weights %s" % "/".join(
                        "%.3f" % w for w in res.get("sample_weights", []))),
        "webdataset": ("webdataset `ShardWriter`",
                       "`wds.RandomMix(probs=%s)` (sample probabilities)" % "/".join(
                           "%.3f" % w for w in res.get("sample_weights", []))),
    }
    for name in PEERS:
        r = res["peers"][name]
        tp = r["throughput"]
        ips = statistics.median(t["images_per_s"] for t in tp) if tp else None
        cpu = statistics.median(t["cpu_s_per_k_images"] for t in tp) if tp else None
        ratio = "" if name == "polyload" or not r.get("ratios") else \
            f" (**{statistics.median(r['ratios']):.2f}x**)"
        pt = res["peers"]["polyload"]["throughput"]
        if name != "polyload" and tp and len(tp) == len(pt):  # every round ran: paired
            cr = statistics.median(t["cpu_s_per_k_images"] / q["cpu_s_per_k_images"]
                                   for t, q in zip(tp, pt))
            cpu_cell = f"{fmt(cpu)} (**{cr:.2f}x** polyload's)"
        else:
            cpu_cell = fmt(cpu)
        st = r["startup"]
        start = f"{statistics.median(st):.2f} s" if st else "failed"
        m = r["mixture"].get("mixture")
        mix = ("%d (%.3f; %d)" % (m["per_step_max"], m["per_step_max_fraction"],
                                  m["cumulative_max"])) if m else "no: " + r["mixture"].get(
                                      "error", "?")
        real = "/".join("%.3f" % x for x in m["realized_fraction"]) if m else "–"
        rs = r["resume"]
        if rs.get("exact"):
            resume = "yes (%d of %d equal)" % (rs["equal_micro_batches"], rs["of"])
        elif "why" in rs:
            resume = "no: " + rs["why"]
        elif "error" in rs:
            resume = "no: " + rs["error"]
        else:
            resume = "no: %d of %d equal, first difference at %s" % (
                rs["equal_micro_batches"], rs["of"], rs["first_difference"])
        rows.append(f"| {name} | {desc[name][0]} | {desc[name][1]} | "
                    f"{fmt(ips) if ips else 'failed'}{ratio} | {cpu_cell} | {start} | "
                    f"{mix} | {real} | {resume} |")
    per_round = "; ".join(
        f"{n}: " + ", ".join(fmt(t["images_per_s"]) for t in res["peers"][n]["throughput"])
        for n in PEERS)
    return "\n".join(rows) + ("\n\nimages/s per round: " + per_round + "; start-up runs: " +
                              "; ".join(f"{n}: " + ", ".join("%.2f" % x for x in
                                        res["peers"][n]["startup"]) for n in PEERS) + ".\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--readme", action="store_true")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "results.json")
    if args.table_only:
        with open(path) as f:
            res = json.load(f)
    else:
        setup()
        res = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "peers": {n: {"throughput": [], "startup": [], "ratios": []} for n in PEERS}}
        for n in PEERS:
            r = run(n, "prepare")
            print(n, "prepare", r, flush=True)
            if "sample_weights" in r:
                res["sample_weights"] = r["sample_weights"]
        if "sample_weights" not in res:
            sys.path.insert(0, HERE)
            import vlm_common
            res["sample_weights"] = vlm_common.peer_weights()
        names = list(PEERS)
        for k in range(args.rounds):
            got = {}
            for j in range(len(names)):
                n = names[(k + j) % len(names)]
                got[n] = run(n, "throughput", "--seconds", str(args.seconds))
                print(k, n, got[n], flush=True)
                if "images_per_s" in got[n]:
                    res["peers"][n]["throughput"].append(got[n])
            for n in names[1:]:
                if "images_per_s" in got[n] and "images_per_s" in got["polyload"]:
                    res["peers"][n]["ratios"].append(
                        got["polyload"]["images_per_s"] / got[n]["images_per_s"])
        for k in range(3):
            for n in names:
                r = run(n, "startup", "--t0", repr(time.time()))
                print("startup", n, r, flush=True)
                if "start_to_first_batch_s" in r:
                    res["peers"][n]["startup"].append(r["start_to_first_batch_s"])
        for n in names:
            res["peers"][n]["mixture"] = run(n, "mixture", "--steps", "30")
            res["peers"][n]["resume"] = run(n, "resume")
            print(n, res["peers"][n]["mixture"], res["peers"][n]["resume"], flush=True)
        res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        with open("/proc/loadavg") as f:
            res["loadavg_end"] = f.read().strip()
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    md = table(res)
    with open(os.path.join(OUT, "table.md"), "w") as f:
        f.write(md)
    print(md)
    if args.readme:
        rp = os.path.join(ROOT, "bench", "peers", "README.md")
        with open(rp) as f:
            text = f.read()
        a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
        with open(rp, "w") as f:
            f.write(text[:a] + "\n" + md + text[b:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
