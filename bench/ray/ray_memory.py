"""Memory of feeding 8 trainer ranks from N Megatron sources, every process counted.

Baseline: 8 rank processes, each with a torch DataLoader (4 workers) over megatron-core's
BlendedDataset of the N sources' GPTDatasets.  polyload: the Ray deployment (planner,
source loaders, constructors, and Ray's own daemons: gcs_server, raylet, agents, idle
workers) feeding 8 trainer clients (polyload.ray.Client), plus the driver that owns the
deployment.  Both sides count their 8 trainer processes (each imports torch).

Memory is proportional set size (PSS, /proc/PID/smaps_rollup), summed over every process
of the side, measured after every rank has taken 8 micro-batches (a polyload client
once its prefetch is full and still: ``Client.prefetched()``, the same state in every
run, recorded as ``client_prefetch``).  Reported at N = 30
and N = 300, with the memory per added source (PSS(300) - PSS(30)) / 270.  Each
polyload side runs in a driver process of its own (the measurement counts that driver).

Also reported: the same without the pages of programs and shared libraries (``pss_own``:
anonymous, shared memory and the mapped files under bench/out/; a library's PSS is
split with every process of the machine that maps it, so it moves with what else runs),
and each side by command and by process.  ``--workers`` sets the baseline's DataLoader
workers per rank (default 4; Megatron-LM's ``--num-workers`` default is 2).

    .venv/bin/python bench/ray/ray_memory.py [--sources 30 300] [--json bench/out/ray_memory.json]
        [--shadows 1] [--workers 4] [--settle 3] [--skip-baseline | --skip-polyload]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note, save_results, start_ray  # noqa: E402

OUT = os.path.join(ROOT, "bench", "out", "ray")
FILES = os.path.join(OUT, "files")
DOCS = 1000
RANKS = 8
WORKERS = 4
SEQ, MBS, GBS, STEPS = 2048, 2, 64, 100
TAKE = 8  # micro-batches each rank takes before the measurement


def write_megatron(prefix, lengths, rng):
    import numpy as np
    lengths = np.asarray(lengths, dtype=np.int32)
    tokens = rng.integers(2, 32000, size=int(lengths.sum()), dtype=np.uint16)
    tokens[np.cumsum(lengths) - 1] = 0
    tokens.tofile(prefix + ".bin")
    pointers = np.zeros(len(lengths), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype=np.uint64).tobytes())
        f.write(np.array([8], dtype=np.uint8).tobytes())
        f.write(np.array([len(lengths)], dtype=np.uint64).tobytes())
        f.write(np.array([len(lengths) + 1], dtype=np.uint64).tobytes())
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())


def make_files(n):
    import numpy as np
    os.makedirs(FILES, exist_ok=True)
    rng = np.random.default_rng(1234)
    for i in range(n):
        p = os.path.join(FILES, f"s{i:04d}")
        lens = rng.integers(10, 1001, size=DOCS)
        if not os.path.exists(p + ".idx"):
            write_megatron(p, lens, rng)


def prefixes(n):
    return [os.path.join(FILES, f"s{i:04d}") for i in range(n)]


def config(n):
    return {"seed": 1234, "seq_length": SEQ, "global_batch_size": GBS, "micro_batch_size": MBS,
            "train_steps": STEPS, "dtype": "int64", "pad_id": 1, "balance": "greedy",
            "topology": {"dp": RANKS}, "threads": 2, "prefetch": 4,
            "sources": [{"name": f"s{i:04d}", "type": "megatron", "path": p, "weight": 1.0}
                        for i, p in enumerate(prefixes(n))]}


# ---------------------------------------------------------------- process accounting


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(root):
    kids, out, todo = children_map(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def pss_kib(pid):
    """{"Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"} in KiB (zeros for a vanished pid)."""
    out = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key = line.split(":")[0]
                if key in out:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


def pss_own_kib(pid):
    """PSS in KiB of a process without the pages of programs and shared libraries
    (executables, .so files, Python's own files): anonymous memory, shared memory (Ray's
    object store) and the mappings of files under bench/out/ (the sources, Megatron's
    index caches).  A library's pages are split with every process of the machine that
    maps it, other sessions' included, so their PSS moves with what else runs; the rest
    is what the side itself holds."""
    own = 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            keep = False
            for line in f:
                first = line.split(" ", 1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) > 5 else ""
                    keep = (not path.startswith("/") or path.startswith("/dev/shm")
                            or path.startswith(os.path.join(ROOT, "bench", "out") + os.sep)
                            or path.startswith(os.path.join(ROOT, "data") + os.sep))
                elif first == "Pss:" and keep:
                    own += int(line.split()[1])
    except OSError:
        pass
    return own


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def measure(pids):
    rows = [(p, comm(p), dict(pss_kib(p), Pss_Own=pss_own_kib(p))) for p in pids]
    by, anon, file = {}, {}, {}
    for _, c, k in rows:
        by[c] = by.get(c, 0) + k["Pss"]
        anon[c] = anon.get(c, 0) + k["Pss_Anon"]
        file[c] = file.get(c, 0) + k["Pss_File"]
    tot = lambda key: sum(k[key] for _, _, k in rows) / 1024  # noqa: E731
    order = sorted(by, key=lambda c: -by[c])
    return {"processes": len(rows), "pss_mib": tot("Pss"), "pss_anon_mib": tot("Pss_Anon"),
            "pss_file_mib": tot("Pss_File"), "pss_shmem_mib": tot("Pss_Shmem"),
            "pss_own_mib": tot("Pss_Own"),
            "by_command_own_mib": {c: round(sum(k["Pss_Own"] for _, c2, k in rows if c2 == c)
                                            / 1024, 2) for c in order},
            "by_command_mib": {c: round(by[c] / 1024, 1) for c in order},
            "by_command_anon_mib": {c: round(anon[c] / 1024, 2) for c in order},
            "by_command_file_mib": {c: round(file[c] / 1024, 2) for c in order},
            "by_command_count": {c: sum(1 for _, c2, _ in rows if c2 == c) for c in order},
            "per_process": sorted([[c, cmdline(p)[:80], round(k["Pss_Anon"] / 1024, 2),
                                    round(k["Pss_File"] / 1024, 2)] for p, c, k in rows])}


def wait_files(paths, procs, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if all(os.path.exists(p) for p in paths):
            return
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"process exited with {p.returncode}")
        time.sleep(0.5)
    raise TimeoutError(f"not ready after {timeout} s")


# ------------------------------------------------------------------------ baseline

RANK_SCRIPT = r"""
import os, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, %(bench)r)
import torch
from _common import EodTokenizer, init_torch_distributed, megatron_quiet
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
megatron_quiet()
init_torch_distributed()
rank = int(sys.argv[1])
cfg = GPTDatasetConfig(random_seed=1234, sequence_length=%(seq)d,
    blend=(%(prefixes)r, [1.0] * %(n)d), split="100,0,0", path_to_cache=%(cache)r,
    tokenizer=EodTokenizer(), reset_position_ids=False, reset_attention_mask=False,
    eod_mask_loss=False, create_attention_mask=False)
train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [%(size)d, 0, 0], lambda: True, cfg).build()
if rank < 0:
    sys.exit(0)  # cache builder
idx = list(range(rank, len(train), %(ranks)d))
loader = torch.utils.data.DataLoader(torch.utils.data.Subset(train, idx), batch_size=%(mbs)d,
                                     num_workers=%(workers)d, persistent_workers=True)
it = iter(loader)
for _ in range(%(take)d):
    next(it)
open(%(ready)r + str(rank), "w").close()
while True:
    time.sleep(1)
"""


def run_baseline(n):
    d = os.path.join(OUT, f"baseline_{n}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    script = os.path.join(d, "rank.py")
    ready = os.path.join(d, "ready")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT % {"bench": os.path.dirname(HERE), "seq": SEQ, "prefixes": prefixes(n), "n": n,
                               "cache": os.path.join(d, "cache"), "size": STEPS * GBS,
                               "ranks": RANKS, "mbs": MBS, "workers": WORKERS, "take": TAKE,
                               "ready": ready})
    subprocess.run([sys.executable, script, "-1"], check=True, cwd=ROOT)  # index cache once
    procs = [subprocess.Popen([sys.executable, script, str(r)], cwd=ROOT,
                              start_new_session=True) for r in range(RANKS)]
    try:
        wait_files([ready + str(r) for r in range(RANKS)], procs, 900)
        time.sleep(2)
        pids = [p for pr in procs for p in tree(pr.pid)]
        return measure(pids)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ------------------------------------------------------------------------ polyload

CLIENT_SCRIPT = r"""
import os, sys, time
import ray, polyload.ray as pr
ray.init(address=sys.argv[2], namespace="bench", log_to_driver=False)
rank = int(sys.argv[1])
c = pr.Client(%(cfg)r, rank=rank, namespace="bench")
for _ in range(%(take)d):
    b = next(c)
# Steady state: the client's prefetch keeps filling after the first micro-batches (the
# C loader expands the packages of its window, prefetch_batches micro-batches; the
# packages of the fetches in flight arrive).  Measured once the prefetch is full (every
# fetch in flight has arrived) and nothing moved for %(settle)g s, so that every client
# of both sides is measured with the same prefetch state, not at a moment of the fill.
t0 = since = time.time()
last = None
while %(settle)g > 0 and time.time() - t0 < 120:
    now = c.prefetched()
    if now != last or now["calls_done"] < now["calls"]:
        last, since = now, time.time()
    elif time.time() - since >= %(settle)g:
        break
    time.sleep(0.25)
import json
with open(%(ready)r + str(rank), "w") as f:
    f.write(json.dumps(dict(c.prefetched(), position=c._loader.position()[0])))
while True:
    time.sleep(1)
"""


SHADOWS = 1  # standby source loaders per actor (launch's default); --shadows
SETTLE = 3.0  # seconds without a new package before a client counts as steady; --settle


def run_polyload(n, loader_actors, constructors):
    import ray

    import polyload.ray as pr
    pr.set_failure_detection_env()  # before ray.init below

    d = os.path.join(OUT, f"polyload_{n}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg_path = os.path.join(d, "cfg.yaml")
    import yaml
    with open(cfg_path, "w") as f:
        yaml.safe_dump(config(n), f, sort_keys=False)
    ready = os.path.join(d, "ready")
    script = os.path.join(d, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT_SCRIPT % {"cfg": cfg_path, "take": TAKE, "ready": ready,
                                 "settle": SETTLE})
    ctx = start_ray(num_cpus=8, object_store_mib=256)
    address = ctx.address_info["address"]
    procs = []
    try:
        dep = pr.launch(cfg_path, num_source_loaders=1, num_constructors=constructors,
                        namespace="bench", max_source_loader_actors=loader_actors,
                        shadows=SHADOWS)
        procs = [subprocess.Popen([sys.executable, script, str(r), address], cwd=ROOT)
                 for r in range(RANKS)]
        wait_files([ready + str(r) for r in range(RANKS)], procs, 900)
        time.sleep(2)
        res = measure(tree(os.getpid()))
        res["actors"] = {k: len(v) for k, v in dep.actors.items()}
        # each client's prefetch state when it was measured (Client.prefetched(): steps
        # pushed to its C loader, packages held, fetches in flight and arrived; the
        # step its trainer stands at)
        res["client_prefetch"] = [json.loads(open(ready + str(r)).read()) for r in range(RANKS)]
        res["client_packages"] = [p["pushed"] for p in res["client_prefetch"]]
        return res
    finally:
        for p in procs:
            p.kill()
            p.wait()
        ray.shutdown()


def run_polyload_fresh(n, loader_actors, constructors):
    """run_polyload in a new driver process (so no earlier run's leftovers in this
    process count); its JSON result on the last line of its output."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(n),
                          "--loader-actors", str(loader_actors),
                          "--constructors", str(constructors), "--shadows", str(SHADOWS),
                          "--settle", str(SETTLE)],
                         cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith('{"processes"')][-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shadows", type=int, default=1,
                    help="standby source loaders per actor (launch's shadows)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="a trainer client is measured once its prefetch is full (every "
                         "fetch in flight arrived) and Client.prefetched() did not change "
                         "for this many seconds after its micro-batches; 0: right after "
                         "them, as before 2026-12-01 21:00")
    ap.add_argument("--sources", type=int, nargs="+", default=[30, 300])
    ap.add_argument("--loader-actors", type=int, default=2)
    ap.add_argument("--constructors", type=int, default=2)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-polyload", action="store_true")
    ap.add_argument("--workers", type=int, default=4,
                    help="DataLoader workers per baseline rank (Megatron-LM's --num-workers "
                         "default is 2)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_memory.json"))
    a = ap.parse_args()
    global SHADOWS, WORKERS, SETTLE
    SHADOWS, WORKERS, SETTLE = a.shadows, a.workers, a.settle
    if a.child is not None:
        print(json.dumps(run_polyload(a.child, a.loader_actors, a.constructors)), flush=True)
        return
    make_files(max(a.sources))
    res = {"machine": machine_note(), "ranks": RANKS, "workers": WORKERS, "docs_per_source": DOCS,
           "seq_length": SEQ, "micro_batch_size": MBS, "global_batch_size": GBS,
           "loader_actors": a.loader_actors, "constructors": a.constructors,
           "settle_s": SETTLE, "runs": {}}
    for n in a.sources:
        t0 = time.time()
        r = {}
        if not a.skip_polyload:
            r["polyload"] = run_polyload_fresh(n, a.loader_actors, a.constructors)
            print(n, "polyload", json.dumps(r["polyload"])[:400], f"{time.time() - t0:.0f}s",
                  flush=True)
        if not a.skip_baseline:
            t0 = time.time()
            r["baseline"] = run_baseline(n)
            print(n, "baseline", json.dumps(r["baseline"])[:400], f"{time.time() - t0:.0f}s", flush=True)
        res["runs"][str(n)] = r
    if len(a.sources) == 2:
        lo, hi = (str(x) for x in sorted(a.sources))
        span = max(a.sources) - min(a.sources)
        for side in ("polyload", "baseline"):
            if side in res["runs"][lo]:
                for kind in ("pss", "pss_anon", "pss_file", "pss_shmem", "pss_own"):
                    res[f"{side}_per_source_{kind}_mib"] = (
                        res["runs"][hi][side][f"{kind}_mib"] - res["runs"][lo][side][f"{kind}_mib"]) / span
        if "baseline_per_source_pss_mib" in res and "polyload_per_source_pss_mib" in res:
            res["per_source_ratio"] = (res["baseline_per_source_pss_mib"]
                                       / res["polyload_per_source_pss_mib"])
            res["per_source_own_ratio"] = (res["baseline_per_source_pss_own_mib"]
                                           / max(1e-9, res["polyload_per_source_pss_own_mib"]))
            res["per_source_anon_ratio"] = (res["baseline_per_source_pss_anon_mib"]
                                            / max(1e-9, res["polyload_per_source_pss_anon_mib"]))
            res["total_ratio"] = {n: res["runs"][n]["baseline"]["pss_mib"] / res["runs"][n]["polyload"]["pss_mib"]
                                  for n in res["runs"]}
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if "per_source_ratio" in res:
        print(save_results("ray_memory", [(
            f"Ray deployment, PSS per added source, {RANKS} ranks, standbys included",
            round(res["polyload_per_source_pss_mib"], 4), "MiB",
            {"peer": f"{RANKS} ranks x {WORKERS} DataLoader workers",
             "peer_value": round(res["baseline_per_source_pss_mib"], 4),
             "lower_is_better": True, "headline": True, "note": "one run"})]))


if __name__ == "__main__":
    main()
