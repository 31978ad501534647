"""What a process crash costs the trainers of a Ray deployment, on this machine.

8 trainer processes (polyload.ray.Client) take micro-batches with COMPUTE seconds of
simulated work each (a sleep); the driver SIGKILLs one role's process at set times:
a source loader (its reads go to the standby), a constructor (Ray restarts it; it
rebuilds from the least step its ranks stand at) and the planner (restarted from its
checkpoint in Ray's KV store).  Per failure: the data wait (time in ``next()``) of
every rank in the 5 s after the kill, max and p99, in milliseconds and in steps (one
micro-batch's compute + mean wait), against the same clients' waits before any kill.

Also: the time to restart the whole deployment and resume from a state (the only
recovery before: ``launch`` + ``Client.load_state_dict`` + first batch), the
effective-training-time ratio for one failure per 10 minutes both ways, the memory of
the standbys per source (PSS of the shadow actors at 30 and 300 sources), and the
planner's checkpoint bytes per step.

    .venv/bin/python bench/ray/ray_faults.py [--json bench/out/ray_faults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note, save_results, start_ray  # noqa: E402
from ray_memory import OUT, RANKS, config, make_files, pss_kib  # noqa: E402

CLIENT = r"""
import json, sys, time
import ray, polyload.ray as pr
ray.init(address=sys.argv[2], namespace="bench", log_to_driver=False)
rank, n, compute, start_at = int(sys.argv[1]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
c = pr.Client(sys.argv[6], rank=rank, namespace="bench", name=sys.argv[7], timeout=120)
next(c)
while time.time() < start_at:
    time.sleep(0.01)
rec = []
for i in range(n):
    t = time.time()
    next(c)
    rec.append((t, time.time() - t))
    time.sleep(compute)
print(json.dumps({"rank": rank, "waits": rec, "retries": c.retries}))
"""


def pct(xs, q):
    import numpy as np
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else 0.0


def pid_of(actor):
    import ray
    for _ in range(300):
        try:
            return int(ray.get(actor.pid.remote(), timeout=30))
        except Exception:  # noqa: BLE001 - restarting
            time.sleep(0.1)
    raise RuntimeError("actor did not come back")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", type=int, default=30)
    ap.add_argument("--compute", type=float, default=0.1)
    ap.add_argument("--micro-batches", type=int, default=260, help="per client")
    ap.add_argument("--prefetch-steps", type=int, default=2)
    ap.add_argument("--constructor-shadows", type=int, default=1,
                    help="warm standbys per constructor (0: wait for Ray's restart)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the standbys' memory (launches at 30 and 300 sources)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_faults.json"))
    a = ap.parse_args()
    import ray
    import yaml

    import polyload
    import polyload.ray as pr
    pr.set_failure_detection_env()  # before ray.init below

    make_files(300)
    d = os.path.join(OUT, "faults")
    os.makedirs(d, exist_ok=True)
    cfg = config(a.sources)
    cfg["train_steps"] = None
    cfg_path = os.path.join(d, "cfg.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    script = os.path.join(d, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT)
    res = {"machine": machine_note(), "ranks": RANKS, "sources": a.sources,
           "compute_s": a.compute, "constructor_shadows": a.constructor_shadows}
    ctx = start_ray(num_cpus=8, object_store_mib=256)
    address = ctx.address_info["address"]
    try:
        # A shallow prefetch, so that the deployment is building while the roles are
        # killed (with the default depth the whole run is built before the first kill).
        dep = pr.launch(cfg_path, num_constructors=2, namespace="bench", name="faults",
                        max_source_loader_actors=2, prefetch_steps=a.prefetch_steps,
                        constructor_shadows=a.constructor_shadows)
        start_at = time.time() + 25
        procs = [subprocess.Popen([sys.executable, script, str(r), address,
                                   str(a.micro_batches), str(a.compute), repr(start_at),
                                   cfg_path, "faults"], cwd=ROOT, stdout=subprocess.PIPE,
                                  text=True) for r in range(RANKS)]
        kills = []
        # the constructor of group 0 twice: its primary, then the standby serving
        # in its place (the primary, restarted by Ray, is then the standby)
        ctor0 = dep.actors["constructor"][0]
        ctor0b = (dep.actors["constructor_shadow"][0] if a.constructor_shadows else ctor0)
        plan = [("source_loader", dep.actors["source_loader"][0]),
                ("constructor", ctor0), ("constructor (again)", ctor0b),
                ("planner", dep.actors["planner"][0])]
        time.sleep(max(0.0, start_at - time.time()) + 6)  # 6 s undisturbed first
        for role, actor in plan:
            pid = pid_of(actor)
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            kills.append({"role": role, "time": t})
            time.sleep(6)
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"client exited with {p.returncode}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        res["constructor_activations"] = [
            ray.get(c.load.remote()).get("activated")
            for c in dep.actors["constructor"] + dep.actors.get("constructor_shadow", [])]
        pm = ray.get(dep.actors["planner"][0].memory.remote())
        res["planner"] = pm
        res["checkpoint_bytes_per_step"] = pm["checkpoint_bytes"] / max(1, pm["next_step"])
        res["failovers"] = dep.failovers()
        res["client_retries"] = sum(o["retries"] for o in outs)
        recs = [w for o in outs for w in o["waits"]]
        first_kill = kills[0]["time"]
        base = [w for t, w in recs if t < first_kill]
        mean_wait = sum(base) / max(1, len(base))
        step_s = a.compute + mean_wait
        res["before"] = {"p99_ms": pct(base, 99) * 1e3, "max_ms": max(base) * 1e3,
                         "step_s": step_s}
        res["kills"] = []
        for k in kills:
            win = [w for t, w in recs if k["time"] <= t < k["time"] + 5.0]
            r = {"role": k["role"], "p99_ms": pct(win, 99) * 1e3,
                 "max_ms": max(win) * 1e3 if win else 0.0,
                 "max_steps": (max(win) if win else 0.0) / step_s,
                 "p99_steps": pct(win, 99) / step_s,
                 "lost_s": sum(w - mean_wait for w in win if w > mean_wait) / RANKS}
            res["kills"].append(r)
            print(json.dumps(r), flush=True)
        state = {"version": 1, "blob": dep.state_dict()["blob"]}
        dep.shutdown()
        # The recovery before: restart everything and load the last state.
        t0 = time.perf_counter()
        dep2 = pr.launch(cfg_path, num_constructors=2, namespace="bench", name="faults2",
                         max_source_loader_actors=2)
        c = pr.Client(cfg_path, rank=0, namespace="bench", name="faults2")
        c.load_state_dict(state)
        next(c)
        res["restart_and_resume_s"] = time.perf_counter() - t0
        c.close()
        dep2.shutdown()
        for k in res["kills"]:
            k["effective_time_ratio_1_per_10min"] = (600 + k["lost_s"]) / 600
        res["restart_effective_time_ratio_1_per_10min"] = (600 + res["restart_and_resume_s"]) / 600
        # Memory of the standbys per source.
        shadow = {}
        for n in (() if a.no_memory else (30, 300)):
            cp = os.path.join(d, f"cfg{n}.yaml")
            with open(cp, "w") as f:
                yaml.safe_dump(config(n), f, sort_keys=False)
            dd = pr.launch(cp, num_constructors=1, namespace="bench", name=f"sh{n}",
                           max_source_loader_actors=2)
            pids = dd.info["pids"]["shadow"]
            shadow[n] = sum(pss_kib(p)["Pss"] for p in pids) / 1024
            if n == 30 and dd.info["pids"].get("constructor_shadow"):
                res["constructor_shadow_pss_mib"] = sum(
                    pss_kib(p)["Pss"] for p in dd.info["pids"]["constructor_shadow"]) / 1024
            dd.shutdown()
        if shadow:
            res["shadow_pss_mib"] = shadow
            res["shadow_mib_per_source"] = (shadow[300] - shadow[30]) / 270
    finally:
        ray.shutdown()
    del polyload
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("failovers", "machine")},
                     indent=1))
    figures = []
    restart = {"peer": "restart the deployment and load the last state",
               "peer_value": round(res["restart_and_resume_s"] * 1000)}
    for k in res["kills"]:
        if k["role"] in ("source_loader", "constructor", "planner"):
            name = k["role"].replace("_", " ")
            extra = {"lower_is_better": True,
                     "note": f"one run, constructor_shadows={a.constructor_shadows}"}
            if k["role"] == "constructor":
                extra.update(restart, headline=True)
            figures.append((f"Ray: data wait max after a SIGKILL of "
                            f"{'the' if k['role'] == 'planner' else 'a'} {name}",
                            round(k["max_ms"], 1), "ms", extra))
    print(save_results("ray_faults", figures))


if __name__ == "__main__":
    main()
