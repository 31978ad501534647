#!/usr/bin/env python3
"""CPU of one Ray actor call that returns k packages, summed over every process on the
machine (the caller, the actor, the raylet and its object store, Ray's other processes):
what a ``DataConstructor.fetch`` of k steps costs the deployment, apart from building them.

For k = 1, 32, 64, 128, 256 packages of ``--package-bytes`` (33,000: one DP rank's step
in ``bench/ray/ray_pipeline.py``), two shapes of the answer: a list of k uint8 arrays (the
fetch before 2026-12-03) and one uint8 array with the k packages back to back (now:
``_pack_fetch``; the concatenation is done in the actor's call, as there).  The actor
method is async, as ``fetch`` is.  CPU per call is the CPU time of all processes
(``/proc/*/stat``) over ``--calls`` calls, divided by the calls; per package, divided by
k too.  Ray is started here with 4 CPUs.

    .venv/bin/python bench/ray/ray_fetch_cost.py [--calls 200] [--json bench/out/ray_fetch_cost.json]
"""
import argparse
import json
import os
import time

import numpy as np
import ray


def _proc_cpu(pid: str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_cpu() -> float:
    total = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                total += _proc_cpu(pid)
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return total


@ray.remote
class Packages:
    def __init__(self, n: int, size: int) -> None:
        rng = np.random.default_rng(0)
        self.pkgs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]

    async def as_list(self, k: int):
        return self.pkgs[:k]

    async def as_one(self, k: int):
        out = self.pkgs[:k]
        ends = np.cumsum([len(a) for a in out], dtype=np.int64)
        return np.concatenate(out), ends, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--package-bytes", type=int, default=33000)
    ap.add_argument("--json")
    a = ap.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ks = (1, 32, 64, 128, 256)
    actor = Packages.remote(max(ks), a.package_bytes)
    rows = []
    try:
        for k in ks:
            for shape in ("as_list", "as_one"):
                method = getattr(actor, shape)
                for _ in range(5):  # warm
                    ray.get(method.remote(k))
                t0, c0 = time.perf_counter(), all_cpu()
                for _ in range(a.calls):
                    ray.get(method.remote(k))
                wall, cpu = time.perf_counter() - t0, all_cpu() - c0
                row = {"packages": k, "shape": shape, "wall_ms_per_call": wall / a.calls * 1e3,
                       "cpu_ms_per_call": cpu / a.calls * 1e3,
                       "cpu_us_per_package": cpu / a.calls / k * 1e6}
                rows.append(row)
                print(f"k={k:4d} {shape:8s} wall {row['wall_ms_per_call']:6.2f} ms/call  "
                      f"CPU (all processes) {row['cpu_ms_per_call']:6.2f} ms/call, "
                      f"{row['cpu_us_per_package']:7.0f} us/package", flush=True)
    finally:
        ray.shutdown()
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"package_bytes": a.package_bytes, "calls": a.calls, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
