"""The Ray deployment on one node against the embedded loader, same config, same 8 ranks:
tokens/s, bytes through the object store per
delivered token, fetch latency with prefetch, and data wait with 100 ms of compute.

Config: ``bench/ray/ray_memory.py``'s (30 synthetic Megatron sources of uint16 tokens,
seq_length 2048, micro-batches of 2, 64 sequences per step, dp 8), endless.  Paired
repeats: each round runs the embedded loader (one ``polyload.Loader`` serving the 8
ranks in this process) and then the deployment (8 trainer processes, each a
``polyload.ray.Client``; 2 constructors, 2 source-loader actors; Ray started with 8
logical CPUs on this 2-core machine, so every role is scheduled).  Tokens are
non-padding tokens; times exclude start-up and a warm-up of 8 micro-batches per rank;
both sides take ``--micro-batches`` per rank (before 2026-12-02 the embedded side took a
quarter of them: a window of ~50 ms, whose figure moved 2x between rounds).

    .venv/bin/python bench/ray/ray_pipeline.py [--rounds 3] [--json bench/out/ray_pipeline.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note, save_results, start_ray  # noqa: E402
from ray_latency import embedded_tokens_per_s as embedded  # noqa: E402
from ray_memory import OUT, RANKS, config, make_files  # noqa: E402

CLIENT = r"""
import json, sys, time
import ray, polyload.ray as pr
rank, addr, n, compute, start_at, cfg, name = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
    float(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7])
pb = int(sys.argv[8]) if len(sys.argv) > 8 and int(sys.argv[8]) > 0 else None
ray.init(address=addr, namespace="bench", log_to_driver=False)
c = pr.Client(cfg, rank=rank, namespace="bench", name=name, prefetch_batches=pb)
for _ in range(8):
    next(c)
tok0, pk0, bytes0 = c.stats()["tokens"], c.packages, c.package_bytes
while time.time() < start_at:
    time.sleep(0.005)
waits = []
t0 = time.perf_counter()
for i in range(n):
    t = time.perf_counter()
    b = next(c)
    waits.append(time.perf_counter() - t)
    if compute:
        time.sleep(compute)
secs = time.perf_counter() - t0
st = c.stats()
print(json.dumps({"rank": rank, "waits": waits, "seconds": secs, "tokens": st["tokens"] - tok0,
                  "packages": c.packages - pk0, "package_bytes": c.package_bytes - bytes0}))
c.close()
"""


def pct(xs, q):
    import numpy as np
    return float(np.percentile(np.asarray(xs), q))


PREFETCH_STEPS = None
CLIENT_PREFETCH = 0


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def deployment(address, cfg_path, script, name, n, compute):
    import ray
    import polyload.ray as pr
    dep = pr.launch(cfg_path, num_constructors=2, max_source_loader_actors=2,
                    namespace="bench", name=name, prefetch_steps=PREFETCH_STEPS)
    try:
        start_at = time.time() + 30  # every client connected and warm before the clock
        procs = [subprocess.Popen([sys.executable, script, str(r), address, str(n), str(compute),
                                   repr(start_at), cfg_path, name, str(CLIENT_PREFETCH)], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True) for r in range(RANKS)]
        roles = {pid: role for role, pids in dep.pids().items() for pid in pids}
        roles.update({p.pid: "client" for p in procs})
        time.sleep(max(0.0, start_at - time.time()))
        cpu0 = {pid: cpu_seconds(pid) for pid in all_pids()}
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"client exited with {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
            if len(outs) == 1:  # CPU while the first client ran (all ran together)
                cpu1 = {pid: cpu_seconds(pid) for pid in all_pids()}
        mem = ray.get([c.memory.remote() for c in dep.actors["constructor"]])
    finally:
        dep.shutdown()
    by_role: dict = {}
    for pid, c1 in cpu1.items():
        d = c1 - cpu0.get(pid, 0.0)
        if d <= 0.005:
            continue
        role = roles.get(pid) or ("ray:" + comm(pid))
        by_role[role] = by_role.get(role, 0.0) + d
    waits = [w for o in outs for w in o["waits"]]
    tokens = sum(o["tokens"] for o in outs)
    secs = max(o["seconds"] for o in outs)
    r = {"micro_batches_per_client": n, "tokens": tokens, "seconds": secs,
         "tokens_per_s": tokens / secs, "p50_ms": pct(waits, 50) * 1e3,
         "p99_ms": pct(waits, 99) * 1e3, "max_ms": max(waits) * 1e3,
         "mean_ms": statistics.fmean(waits) * 1e3,
         "object_store_bytes_per_token": sum(o["package_bytes"] for o in outs) / tokens,
         "packages": sum(o["packages"] for o in outs),
         "units_per_build_batch": sum(m["units_built"] for m in mem) / max(1, sum(
             m["build_batches"] for m in mem)),
         "cpu_seconds_by_role": {k: round(v, 3) for k, v in sorted(by_role.items(),
                                                                   key=lambda kv: -kv[1])}}
    if compute:
        r["p99_over_step"] = pct(waits, 99) / (compute + statistics.fmean(waits))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=8000,
                    help="per rank, no compute (both sides; ~4 s of the deployment)")
    ap.add_argument("--compute-micro-batches", type=int, default=100)
    ap.add_argument("--compute", type=float, default=0.1)
    ap.add_argument("--prefetch-steps", type=int, default=None,
                    help="launch(prefetch_steps=...); default: launch's")
    ap.add_argument("--client-prefetch-batches", type=int, default=0,
                    help="Client(prefetch_batches=...); 0: the Client's default")
    ap.add_argument("--skip-wait", action="store_true")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_pipeline.json"))
    a = ap.parse_args()
    global PREFETCH_STEPS, CLIENT_PREFETCH
    PREFETCH_STEPS = a.prefetch_steps
    CLIENT_PREFETCH = a.client_prefetch_batches
    import ray
    import yaml

    make_files(a.sources)
    d = os.path.join(OUT, "pipeline")
    os.makedirs(d, exist_ok=True)
    cfg = config(a.sources)
    cfg["train_steps"] = None
    cfg_path = os.path.join(d, "cfg.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    script = os.path.join(d, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT)
    ctx = start_ray(num_cpus=8, object_store_mib=512)
    addr = ctx.address_info["address"]
    res = {"machine": machine_note(), "ranks": RANKS, "sources": a.sources, "rounds": []}
    try:
        for k in range(a.rounds):
            e = embedded(cfg_path, a.micro_batches)  # the same micro-batches per rank
            f = deployment(addr, cfg_path, script, f"fetch{k}", a.micro_batches, 0.0)
            rnd = {"embedded": e, "fetch": f, "ratio": f["tokens_per_s"] / e["tokens_per_s"]}
            print(json.dumps({"round": k, "embedded_tokens_per_s": e["tokens_per_s"],
                              "ray_tokens_per_s": f["tokens_per_s"], "ratio": rnd["ratio"],
                              "p50_ms": f["p50_ms"], "p99_ms": f["p99_ms"],
                              "bytes_per_token": f["object_store_bytes_per_token"],
                              "seconds": f["seconds"],
                              "units_per_batch": f["units_per_build_batch"],
                              "cpu_seconds_by_role": f["cpu_seconds_by_role"]}), flush=True)
            res["rounds"].append(rnd)
        if not a.skip_wait:
            w = deployment(addr, cfg_path, script, "wait", a.compute_micro_batches, a.compute)
            res["wait"] = w
            print("wait", json.dumps({k: w[k] for k in ("p50_ms", "p99_ms", "max_ms",
                                                          "p99_over_step")}), flush=True)
    finally:
        ray.shutdown()
    ratios = [r["ratio"] for r in res["rounds"]]
    res["ratio_median"] = statistics.median(ratios) if ratios else None  # --rounds 0: wait only
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"ratios": ratios, "median": res["ratio_median"]}))
    figures = []
    if ratios:
        figures.append((f"Ray deployment on one node, tokens/s as a share of the embedded "
                        f"loader's, {RANKS} ranks", round(100 * res["ratio_median"], 1), "%",
                        {"headline": True, "note": f"median of {len(ratios)} rounds, "
                         f"{100 * min(ratios):.1f}-{100 * max(ratios):.1f} %"}))
    if "wait" in res:
        figures.append((f"Ray deployment on one node: data wait p99, {RANKS} ranks x "
                        f"{a.compute * 1000:.0f} ms compute",
                        round(100 * res["wait"]["p99_over_step"], 2), "% of step",
                        {"lower_is_better": True}))
    if figures:
        print(save_results("ray_pipeline", figures))


if __name__ == "__main__":
    main()
