"""Memory per added raw-text source with a tokenizer: the Ray deployment vs per-rank loaders.

N raw `type: jsonl` sources (documents of the demo corpus, data/raw/*.jsonl, dealt out line
by line so every source holds a mix of fortunes, kernel docs, man pages and Python source),
each with a tokenizer file of its own: a copy of the same real byte-level BPE
data/tokenizer.json per source (`tokenizer: {type: hf, path: tok_i.json}`), as sources with
different tokenizers would have; nothing shares a loaded tokenizer across sources.

Baseline (the HF datasets / torchtitan pattern): 8 rank processes, each a torch DataLoader
(4 workers, persistent) over an IterableDataset that reads the N jsonl files, tokenizes each
document with its source's `tokenizers.Tokenizer` (+ eos) and packs sequences of
seq_length + 1 tokens.  The dataset loads every source's tokenizer in the rank process
(`--tokenizer-load main`, as torchtitan's dataset holds its tokenizer; the workers are
forked and share its pages copy-on-write) or in each worker when it starts
(`--tokenizer-load worker`).  Each worker interleaves the sources one document each, and
the rank takes micro-batches until every worker has encoded documents of every source
(and at least TAKE micro-batches).

polyload: the Ray deployment (driver, gcs_server, raylet, agents, planner, source loaders
with their shadows, constructors) feeding 8 trainer clients (polyload.ray.Client), each
tokenizer loaded in the source loader actors that serve its source; every rank takes TAKE
micro-batches.  Both sides count their 8 trainer processes (each imports torch).

PSS as in bench/ray/ray_memory.py (its helpers), summed over every process of the side; per
added source = (PSS(hi) - PSS(lo)) / (hi - lo); --repeats paired rounds (each round: both
sides at both counts), the median of the rounds reported.

    .venv/bin/python bench/ray/ray_text_memory.py [--sources 4 16] [--repeats 3]
        [--tokenizer-load main|worker] [--take 8] [--shadows 1] [--read-timeout 30]
        [--json bench/out/ray_text_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ray_memory as rm  # noqa: E402
from _harness import ROOT, machine_note, save_results, start_ray  # noqa: E402

OUT = os.path.join(ROOT, "bench", "out", "ray_text")
FILES = os.path.join(OUT, "files")
RAW = [os.path.join(ROOT, "data", "raw", f) for f in
       ("fortunes.jsonl", "kernel_docs.jsonl", "man_i18n.jsonl", "python_src.jsonl")]
TOKENIZER = os.path.join(ROOT, "data", "tokenizer.json")
MAX_SOURCES = 64  # lines are dealt out over this many source files
RANKS, WORKERS = 8, 4
SEQ, MBS, GBS, STEPS = 2048, 2, 64, 100
TAKE = 8
TOKENIZER_LOAD = "main"


def make_files():
    os.makedirs(FILES, exist_ok=True)
    if os.path.exists(os.path.join(FILES, f"s{MAX_SOURCES - 1:03d}.jsonl")):
        return
    outs = [open(os.path.join(FILES, f"s{i:03d}.jsonl"), "w", encoding="utf-8")
            for i in range(MAX_SOURCES)]
    j = 0
    for path in RAW:
        with open(path, encoding="utf-8") as f:
            for line in f:
                outs[j % MAX_SOURCES].write(line)
                j += 1
    for o in outs:
        o.close()
    for i in range(MAX_SOURCES):
        shutil.copyfile(TOKENIZER, os.path.join(FILES, f"tok{i:03d}.json"))


SHARED_TOKENIZER = False  # --shared-tokenizer: every source names data/tokenizer.json


def sources(n):
    return [(os.path.join(FILES, f"s{i:03d}.jsonl"),
             TOKENIZER if SHARED_TOKENIZER else os.path.join(FILES, f"tok{i:03d}.json"))
            for i in range(n)]


def config(n):
    return {"seed": 1234, "seq_length": SEQ, "global_batch_size": GBS, "micro_batch_size": MBS,
            "train_steps": STEPS, "dtype": "int64", "pad_id": 1, "balance": "greedy",
            "topology": {"dp": RANKS}, "threads": 2, "prefetch": 4,
            "sources": [{"name": f"s{i:03d}", "type": "jsonl", "path": p, "weight": 1.0 / n,
                         "tokenizer": {"type": "hf", "path": t, "add_eos": True}}
                        for i, (p, t) in enumerate(sources(n))]}


# ------------------------------------------------------------------------ baseline

RANK_SCRIPT = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from tokenizers import Tokenizer

SOURCES, SEQ, LOAD, READY = %(sources)r, %(seq)d, %(load)r, %(ready)r
rank = int(sys.argv[1])


def load(paths):
    # one Tokenizer per file: sources that name the same file share it
    cache = {}
    return [cache[t] if t in cache else cache.setdefault(t, Tokenizer.from_file(t))
            for t in paths]


class TextMix(torch.utils.data.IterableDataset):
    # jsonl sources, each with its own tokenizer; one document of each source in turn,
    # packed into SEQ + 1 tokens (input_ids, labels), eos after every document.
    def __init__(self):
        self.toks = load([t for _, t in SOURCES]) if LOAD == "main" else None

    def __iter__(self):
        w = torch.utils.data.get_worker_info()
        wid = w.id if w else 0
        toks = self.toks or load([t for _, t in SOURCES])
        eos = toks[0].token_to_id("<|endoftext|>")
        files = [open(p, encoding="utf-8") for p, _ in SOURCES]
        for f in files:  # rank/worker-specific starting offset: different documents
            for _ in range((rank * 4 + wid) * 3):
                f.readline()
        used, buf, i = set(), [], 0
        while True:
            s = i %% len(files)
            i += 1
            line = files[s].readline()
            if not line:
                files[s].seek(0)
                line = files[s].readline()
            buf += toks[s].encode(json.loads(line)["text"], add_special_tokens=False).ids + [eos]
            used.add(s)
            if len(used) == len(files):
                open(READY + "w%%d_%%d" %% (rank, wid), "w").close()
            while len(buf) >= SEQ + 1:
                x = torch.tensor(buf[:SEQ + 1], dtype=torch.int64)
                buf = buf[SEQ + 1:]
                yield {"input_ids": x[:-1], "labels": x[1:]}


loader = torch.utils.data.DataLoader(TextMix(), batch_size=%(mbs)d, num_workers=%(workers)d,
                                     persistent_workers=True)
it = iter(loader)
taken = 0
while taken < %(take)d or not all(os.path.exists(READY + "w%%d_%%d" %% (rank, w))
                                  for w in range(%(workers)d)):
    next(it)
    taken += 1
open(READY + str(rank), "w").close()
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
        f.write(RANK_SCRIPT % {"sources": sources(n), "seq": SEQ, "load": TOKENIZER_LOAD,
                               "ready": ready, "mbs": MBS, "workers": WORKERS, "take": TAKE})
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    procs = [subprocess.Popen([sys.executable, script, str(r)], cwd=ROOT, env=env,
                              start_new_session=True) for r in range(RANKS)]
    try:
        rm.wait_files([ready + str(r) for r in range(RANKS)], procs, 900)
        time.sleep(2)
        return rm.measure([p for pr in procs for p in rm.tree(pr.pid)])
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ------------------------------------------------------------------------ polyload


def run_polyload(n, loader_actors, constructors, shadows, read_timeout=30.0):
    import ray
    import yaml

    import polyload.ray as pr
    pr.set_failure_detection_env()  # before ray.init below

    d = os.path.join(OUT, f"polyload_{n}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg_path = os.path.join(d, "cfg.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(config(n), f, sort_keys=False)
    ready = os.path.join(d, "ready")
    script = os.path.join(d, "client.py")
    with open(script, "w") as f:
        f.write(rm.CLIENT_SCRIPT % {"cfg": cfg_path, "take": TAKE, "ready": ready,
                                     "settle": 0})
    ctx = start_ray(num_cpus=8, object_store_mib=256)
    address = ctx.address_info["address"]
    procs = []
    try:
        dep = pr.launch(cfg_path, num_source_loaders=1, num_constructors=constructors,
                        namespace="bench", max_source_loader_actors=loader_actors,
                        shadows=shadows, read_timeout=read_timeout)
        procs = [subprocess.Popen([sys.executable, script, str(r), address], cwd=ROOT)
                 for r in range(RANKS)]
        rm.wait_files([ready + str(r) for r in range(RANKS)], procs, 900)
        time.sleep(2)
        res = rm.measure(rm.tree(os.getpid()))
        res["actors"] = {k: len(v) for k, v in dep.actors.items()}
        # reads moved to a standby (a loader that did not answer within read_timeout on
        # a loaded machine): that standby then loads its tokenizers and tokenizes too
        res["failovers"] = sum(len(ray.get(c.failover_log.remote()))
                               for c in dep.actors["constructor"])
        res["standby_tokenizers_loaded"] = sum(
            bool(t and t["loaded"]) for a in dep.actors["shadow"]
            for t in ray.get(a.tokenizers.remote()).values())
        return res
    finally:
        for p in procs:
            p.kill()
            p.wait()
        ray.shutdown()


def run_polyload_fresh(n, a):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(n),
                          "--loader-actors", str(a.loader_actors),
                          "--constructors", str(a.constructors), "--shadows", str(a.shadows), "--take", str(a.take),
                          "--read-timeout", str(a.read_timeout)]
                         + (["--shared-tokenizer"] if a.shared_tokenizer else []),
                         cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith('{"processes"')][-1])


KINDS = ("pss", "pss_anon", "pss_file", "pss_own")


def main():
    global TOKENIZER_LOAD, TAKE, SHARED_TOKENIZER
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sources", type=int, nargs=2, default=[4, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loader-actors", type=int, default=2)
    ap.add_argument("--constructors", type=int, default=2)
    ap.add_argument("--shadows", type=int, default=1,
                    help="standby source loaders per actor (launch's default 1)")
    ap.add_argument("--tokenizer-load", choices=("main", "worker"), default="main",
                    help="baseline: tokenizers loaded in the rank process before the "
                         "workers fork (torchtitan) or in each worker")
    ap.add_argument("--read-timeout", type=float, default=30.0,
                    help="launch's read_timeout: a read unanswered this long moves to the "
                         "standby (which then loads its tokenizers); raise it on a loaded "
                         "machine so that the load does not move reads")
    ap.add_argument("--shared-tokenizer", action="store_true",
                    help="every source names the same tokenizer file (one tokenizer for the "
                         "run, as most runs have), on both sides; default: a copy per source")
    ap.add_argument("--take", type=int, default=TAKE,
                    help="micro-batches each rank takes at least before the measurement")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-polyload", action="store_true")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "out", "ray_text_memory.json"))
    a = ap.parse_args()
    TOKENIZER_LOAD, TAKE, SHARED_TOKENIZER = a.tokenizer_load, a.take, a.shared_tokenizer
    if a.child is not None:
        print(json.dumps(run_polyload(a.child, a.loader_actors, a.constructors, a.shadows,
                                      a.read_timeout)),
              flush=True)
        return
    lo, hi = sorted(a.sources)
    assert hi <= MAX_SOURCES
    make_files()
    res = {"machine": machine_note(), "ranks": RANKS, "workers": WORKERS,
           "tokenizer_load": TOKENIZER_LOAD, "shared_tokenizer": SHARED_TOKENIZER,
           "sources": [lo, hi], "seq_length": SEQ,
           "micro_batch_size": MBS, "global_batch_size": GBS, "take": TAKE,
           "loader_actors": a.loader_actors, "constructors": a.constructors,
           "shadows": a.shadows, "read_timeout": a.read_timeout, "rounds": []}
    sides = [s for s in ("polyload", "baseline") if not getattr(a, "skip_" + s)]
    for k in range(a.repeats):
        rnd = {}
        for side in sides:
            for n in (lo, hi):
                t0 = time.time()
                r = (run_polyload_fresh(n, a) if side == "polyload" else run_baseline(n))
                rnd.setdefault(side, {})[str(n)] = r
                extra = (f", failovers {r['failovers']}, standby tokenizers loaded "
                         f"{r['standby_tokenizers_loaded']}" if "failovers" in r else "")
                print(f"round {k} {side} {n}: {r['processes']} processes, "
                      f"PSS {r['pss_mib']:.0f} MiB (anon {r['pss_anon_mib']:.0f}, own "
                      f"{r['pss_own_mib']:.0f}) {time.time() - t0:.0f}s{extra}", flush=True)
            for kind in KINDS:
                rnd[side][f"per_source_{kind}_mib"] = (
                    rnd[side][str(hi)][f"{kind}_mib"] - rnd[side][str(lo)][f"{kind}_mib"]) / (hi - lo)
        if len(sides) == 2:
            rnd["per_source_ratio"] = (rnd["baseline"]["per_source_pss_mib"]
                                       / rnd["polyload"]["per_source_pss_mib"])
            rnd["per_source_own_ratio"] = (rnd["baseline"]["per_source_pss_own_mib"]
                                           / rnd["polyload"]["per_source_pss_own_mib"])
        print(f"round {k}:", json.dumps({s: {kk: round(v, 2) for kk, v in rnd[s].items()
                                             if kk.startswith("per_source")} for s in sides},
                                        ), {kk: round(v, 2) for kk, v in rnd.items()
                                            if kk.endswith("ratio")}, flush=True)
        res["rounds"].append(rnd)
    for side in sides:
        for kind in KINDS:
            res[f"{side}_per_source_{kind}_mib_median"] = statistics.median(
                r[side][f"per_source_{kind}_mib"] for r in res["rounds"])
    if len(sides) == 2:
        for key in ("per_source_ratio", "per_source_own_ratio"):
            res[key + "_median"] = statistics.median(r[key] for r in res["rounds"])
            res[key + "_all"] = [round(r[key], 2) for r in res["rounds"]]
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "rounds"}, indent=1))
    if len(sides) == 2 and a.tokenizer_load == "worker" and not a.shared_tokenizer:
        print(save_results("ray_text_memory", [(
            f"Ray deployment, PSS per added raw-text source with its own tokenizer file, "
            f"{RANKS} ranks", round(res["polyload_per_source_pss_mib_median"], 2), "MiB",
            {"peer": f"{RANKS} ranks x {WORKERS} DataLoader workers, each loading the "
                     "tokenizers",
             "peer_value": round(res["baseline_per_source_pss_mib_median"], 1),
             "lower_is_better": True,
             "note": f"median of {len(res['rounds'])} paired rounds"})]))


if __name__ == "__main__":
    main()
