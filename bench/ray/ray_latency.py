"""Data wait and fetch latency of 8 trainer clients fed by a Ray deployment, and raw
tokens/s of the deployment against the embedded loader, on this machine.

(2) data wait: 8 trainer processes (polyload.ray.Client) simulate COMPUTE seconds of
    work per micro-batch (a sleep); the wait is the time spent in ``next()``; reported
    as p50/p99 and p99 / (compute + mean wait), the fraction of the step spent waiting.
(3) fetch latency: the same clients with no compute, taking micro-batches back to back
    (prefetch on: the constructor builds steps ahead, the client keeps 2 requests in
    flight); p50/p99 of ``next()``, and the deployment's total non-padding tokens/s.
    The embedded loader (polyload.Loader serving the 8 ranks in one process) gives the
    reference tokens/s.

    .venv/bin/python bench/ray/ray_latency.py [--sources 30] [--json bench/out/ray_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note, save_results, start_ray  # noqa: E402
from ray_memory import OUT, RANKS, config, make_files  # noqa: E402

CLIENT = r"""
import json, os, sys, time
import numpy as np
import ray, polyload.ray as pr
ray.init(address=sys.argv[2], namespace="bench", log_to_driver=False)
rank, n, compute, start_at = int(sys.argv[1]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
c = pr.Client(sys.argv[6], rank=rank, namespace="bench", name=sys.argv[7])
while time.time() < start_at:
    time.sleep(0.01)
t0 = time.perf_counter()
waits = []
for i in range(n):
    t = time.perf_counter()
    b = next(c)
    waits.append(time.perf_counter() - t)
    if compute:
        time.sleep(compute)
secs = time.perf_counter() - t0
st = c.stats()
print(json.dumps({"rank": rank, "wait_s": waits, "seconds": secs,
                  "tokens": st["tokens"]}))
"""


def pct(xs, q):
    import numpy as np
    return float(np.percentile(np.asarray(xs), q))


def run_clients(address, cfg_path, name, n, compute, script):
    start_at = time.time() + 25  # all clients connected and warm before the clock
    procs = [subprocess.Popen([sys.executable, script, str(r), address, str(n), str(compute),
                               repr(start_at), cfg_path, name],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for r in range(RANKS)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"client exited with {p.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def embedded_tokens_per_s(cfg, n_mb):
    import polyload
    with polyload.Loader(cfg, rank=0, ranks=range(RANKS)) as loader:
        for r in range(RANKS):  # warm-up: the first step
            loader.next_batch(r)
        before = loader.stats()["tokens"]
        t0 = time.perf_counter()
        for _ in range(n_mb):
            for r in range(RANKS):
                loader.next_batch(r)
        secs = time.perf_counter() - t0
        tokens = loader.stats()["tokens"] - before
    return {"tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", type=int, default=30)
    ap.add_argument("--compute", type=float, default=0.1)
    ap.add_argument("--micro-batches", type=int, default=60, help="per client, with compute")
    ap.add_argument("--fast-micro-batches", type=int, default=200, help="per client, no compute")
    ap.add_argument("--constructors", type=int, default=2)
    ap.add_argument("--loader-actors", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_latency.json"))
    a = ap.parse_args()
    import ray
    import yaml

    import polyload.ray as pr
    pr.set_failure_detection_env()  # before ray.init below

    make_files(a.sources)
    d = os.path.join(OUT, "latency")
    os.makedirs(d, exist_ok=True)
    cfg = config(a.sources)
    cfg["train_steps"] = None  # endless
    cfg_path = os.path.join(d, "cfg.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    script = os.path.join(d, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT)
    res = {"machine": machine_note(), "ranks": RANKS, "sources": a.sources,
           "compute_s": a.compute, "constructors": a.constructors,
           "loader_actors": a.loader_actors, "config": {k: v for k, v in cfg.items() if k != "sources"}}
    res["embedded"] = embedded_tokens_per_s(cfg_path, 100)
    print("embedded", json.dumps(res["embedded"]), flush=True)
    ctx = start_ray(num_cpus=8, object_store_mib=256)
    try:
        for label, n, compute in (("wait", a.micro_batches, a.compute),
                                  ("fetch", a.fast_micro_batches, 0.0)):
            name = f"lat_{label}"
            dep = pr.launch(cfg_path, num_source_loaders=1, num_constructors=a.constructors,
                            namespace="bench", name=name, max_source_loader_actors=a.loader_actors)
            try:
                outs = run_clients(ctx.address_info["address"], cfg_path, name, n, compute, script)
            finally:
                dep.shutdown()
            waits = [w for o in outs for w in o["wait_s"][2:]]  # steady state
            tokens = sum(o["tokens"] for o in outs)
            secs = max(o["seconds"] for o in outs)
            r = {"micro_batches_per_client": n, "p50_ms": pct(waits, 50) * 1e3,
                 "p99_ms": pct(waits, 99) * 1e3, "max_ms": max(waits) * 1e3,
                 "mean_ms": sum(waits) / len(waits) * 1e3,
                 "tokens_per_s": tokens / secs, "seconds": secs}
            if compute:
                r["p99_over_step"] = pct(waits, 99) / (compute + sum(waits) / len(waits))
            res[label] = r
            print(label, json.dumps(r), flush=True)
    finally:
        ray.shutdown()
    res["ray_over_embedded_tokens_per_s"] = res["fetch"]["tokens_per_s"] / res["embedded"]["tokens_per_s"]
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("embedded", "wait", "fetch",
                                          "ray_over_embedded_tokens_per_s")}, indent=1))
    print(save_results("ray_latency", [(
        f"Ray: data wait p99, {RANKS} clients x {a.compute * 1000:.0f} ms compute",
        round(100 * res["wait"]["p99_over_step"], 2), "% of step",
        {"lower_is_better": True, "note": "one run"})]))


if __name__ == "__main__":
    main()
