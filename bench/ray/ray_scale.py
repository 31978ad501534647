"""The deployment at scale on a 3-node local Ray cluster: time from ``launch`` until every trainer rank has its first batch, steady
non-padding tokens/s, PSS of every process (Ray daemons, GCS and actors included), and
how each grows from 8 to 64 ranks and from 30 to 300 sources.

Trainer ranks are ``polyload.ray.Client`` objects, 16 per process (threads), started and
connected to Ray *before* the clock starts; the clock starts when ``launch`` is called.
Sources are ``bench/ray/ray_memory.py``'s synthetic Megatron files (1,000 documents of
10-1,000 uint16 tokens each).  seq_length 2048, micro-batches of 1, 2 per rank per step.
Ray's cluster_utils.Cluster: a head and two worker nodes, 8 logical CPUs each, on this
2-core machine.  The GCS and head-node memory over time are sampled while serving.

    .venv/bin/python bench/ray/ray_scale.py [--seconds 60] [--json bench/out/ray_scale.json]
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
from _harness import ROOT, machine_note  # noqa: E402
from ray_memory import OUT, comm, make_files, measure, prefixes, tree  # noqa: E402

TRAINER = r"""
import json, os, sys, threading, time
import ray, polyload.ray as pr
addr, cfg, name, first, n_ranks, go, seconds = (sys.argv[1], sys.argv[2], sys.argv[3],
    int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], float(sys.argv[7]))
ray.init(address=addr, namespace="scale", log_to_driver=False)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
res = {}
def run(rank):
    c = pr.Client(cfg, rank=rank, namespace="scale", name=name)
    next(c)
    t_first = time.time()
    tok0 = c.stats()["tokens"]
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        next(c)
        n += 1
    res[rank] = {"first": t_first, "tokens": c.stats()["tokens"] - tok0,
                 "seconds": time.perf_counter() - t0, "micro_batches": n}
    c.close()
ts = [threading.Thread(target=run, args=(r,)) for r in range(first, first + n_ranks)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(res), flush=True)
"""


def config(n_sources, ranks):
    return {"seed": 1, "seq_length": 2048, "global_batch_size": 2 * ranks, "micro_batch_size": 1,
            "train_steps": None, "pad_id": 1, "topology": {"dp": ranks}, "prefetch": 4,
            "sources": [{"name": f"s{i:04d}", "type": "megatron", "path": p, "weight": 1.0}
                        for i, p in enumerate(prefixes(n_sources))]}


def gcs_rss_mib():
    out = 0
    for p in os.listdir("/proc"):
        if p.isdigit() and comm(int(p)) == "gcs_server":
            with open(f"/proc/{p}/statm") as f:
                out += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return out / (1 << 20)


def run_one(cluster, n_sources, ranks, seconds, script, d):
    import yaml

    import polyload.ray as pr

    name = f"s{n_sources}r{ranks}"
    cfg = config(n_sources, ranks)
    path = os.path.join(d, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    go = os.path.join(d, f"{name}.go")
    if os.path.exists(go):
        os.remove(go)
    per = 16 if ranks >= 16 else ranks
    procs = [subprocess.Popen([sys.executable, script, cluster.address, path, name, str(first),
                               str(per), go, str(seconds)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True) for first in range(0, ranks, per)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    t0 = time.time()
    dep = pr.launch(path, num_constructors=max(1, ranks // 16), namespace="scale", name=name)
    t_launched = time.time()
    open(go, "w").close()
    gcs = []
    try:
        done = [None] * len(procs)
        while any(x is None for x in done):
            for i, p in enumerate(procs):
                if done[i] is None and p.poll() is not None:
                    done[i] = p.stdout.read()
            gcs.append((time.time() - t0, gcs_rss_mib()))
            if len(gcs) == 3:  # serving: PSS of everything
                pss = measure(tree(os.getpid()))
            time.sleep(1.0)
    finally:
        dep.shutdown()
    res = {}
    for out in done:
        res.update(json.loads(out.strip().splitlines()[-1]))
    first_all = max(v["first"] for v in res.values()) - t0
    tokens = sum(v["tokens"] for v in res.values())
    secs = max(v["seconds"] for v in res.values())
    return {"sources": n_sources, "ranks": ranks, "launch_s": t_launched - t0,
            "first_batch_all_ranks_s": first_all, "tokens_per_s": tokens / secs,
            "pss_mib": pss["pss_mib"], "pss_by_command_mib": dict(list(pss["by_command_mib"].items())[:8]),
            "gcs_rss_mib": gcs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_scale.json"))
    ap.add_argument("--cases", default="30x8,300x8,30x64,300x64")
    a = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    make_files(300)
    d = os.path.join(OUT, "scale")
    os.makedirs(d, exist_ok=True)
    script = os.path.join(d, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    node = {"num_cpus": 8, "object_store_memory": 512 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="scale", log_to_driver=False)
    res = {"machine": machine_note(), "cases": []}
    try:
        for case in a.cases.split(","):
            ns, nr = (int(x) for x in case.split("x"))
            r = run_one(cluster, ns, nr, a.seconds, script, d)
            print(json.dumps({k: v for k, v in r.items() if k != "gcs_rss_mib"}), flush=True)
            res["cases"].append(r)
    finally:
        ray.shutdown()
        cluster.shutdown()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
