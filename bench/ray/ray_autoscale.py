"""Autoscaled source-loader pools vs fixed pools, side by side on one local multi-node Ray cluster.

Scenario: three sources of different cost from the demo corpus (``make corpus``):
``code`` (pre-tokenized Megatron, data/python_src_text_document), ``docs`` (raw JSON
Lines tokenized online with data/tokenizer.json, Hugging Face tokenizers, one thread per
loader) and ``img`` (image-text WebDataset data/vlm: real photos decoded and resized to
224 x 224 in the source loaders, 256 visual tokens each, captions as bytes).  A
step schedule moves weight from the cheap source to the costly ones at ``--change``.
8 trainer ranks (``polyload.ray.Client``, one process each, as data-parallel training
runs; ``--rank-threads``: threads of this process, as before 2026-12-02, whose waits
include the eight threads' turns on the interpreter lock) with simulated compute
(``--compute`` seconds per step) and a barrier per step; a step's data wait is the
longest wait of its ranks.

Modes, in paired rounds (autoscale then fixed, ``--rounds`` times):

- ``autoscale``: ``launch(autoscale=...)``, pools start packed on the shared loaders;
- ``fixed``: pools sized for the first step's mixture (the policy's formula at step 0
  with the costs the autoscaled run measured), pinned with ``Deployment.scale``.

Figures: data wait p99 as a fraction of the step (steps after ``--warmup``, and
around the change), loader CPU-seconds reserved and used vs the ideal allocation computed
offline from the measured costs (the integer loaders each step needs, and the
fractional need sum_t sum_s w_s(t) x tokens per step x cost_s), and for each pool the
step at which it reached its new size relative to the schedule change.  The ideal is
given with three sets of costs: the run's own, measured over the whole run in the
source loaders (per source, the CPU of its reads and of its tokenizing, both timed per
source, over the tokens delivered: ``ideal_measured_cpu_s``); the fixed pool's, whose
one loader read with no other loader beside it (``ideal_fixed_costs_cpu_s``); and the
autoscaler's last estimate (``ideal_fractional_cpu_s``, a median of short windows).

    .venv/bin/python bench/ray/ray_autoscale.py [--rounds 2] [--json bench/out/ray_autoscale.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note, save_results  # noqa: E402

MiB = 1 << 20
NS = "polyload_autoscale"


def config(args):
    data = os.path.join(ROOT, "data")
    tok = {"type": "hf", "path": os.path.join(data, "tokenizer.json"), "add_eos": True}
    before = {"code": 0.85, "docs": 0.1, "img": 0.05}
    after = {"code": 0.3, "docs": 0.3, "img": 0.4}
    return {
        "seed": 7, "seq_length": args.seq_length, "global_batch_size": 8 * args.mbs,
        "micro_batch_size": 1, "train_steps": args.steps, "dtype": "int32", "pad_id": 1,
        "topology": {"dp": 8}, "balance": "greedy", "on_error": "skip",
        "long_documents": "truncate",
        "tokenizer": tok,
        "sources": [
            {"name": "code", "type": "megatron",
             "path": os.path.join(data, "python_src_text_document")},
            {"name": "docs", "type": "jsonl", "lookahead": 64,
             "path": os.path.join(data, "raw", "kernel_docs.jsonl")},
            {"name": "img", "type": "webdataset", "index": "memory", "caption": "txt",
             "path": os.path.join(data, "vlm", "shard-{000000..000003}.tar"),
             "image": {"mode": "fixed", "size": 224, "patch_size": 14, "token_id": 31999}},
        ],
        "schedule": {"interpolation": "step", "points": [
            {"step": 0, "weights": before}, {"step": args.change, "weights": after}]},
    }


def run_once(mode, cfg, args, fixed=None, ranks=None):
    import numpy as np
    import ray

    import polyload.ray as pr

    name = f"as_{mode}"
    auto = None
    if mode == "autoscale":
        auto = {"interval_s": 0.5, "horizon_steps": args.horizon, "headroom": 0.1,
                "loader_cpus": 1.0, "max_loaders": 4, "cpu_budget": args.cpu_budget,
                "down_delay_s": 5.0, "steady_s": 1.0,
                "placement": [{"resources": {"cpu_node": 0.01}, "num_cpus": 1.0}]}
    # One shared loader for the three sources at launch (what a pool sized for the
    # average looks like with many sources); dedicated pools come on top of it.
    dep = pr.launch(cfg, namespace=NS, name=name, autoscale=auto, shadows=0,
                    num_constructors=2, prefetch_steps=4, max_source_loader_actors=1,
                    placement={"planner": {"resources": {"head_node": 0.01}},
                               "source_loader": {"resources": {"cpu_node": 0.01}},
                               "constructor": {"resources": {"head_node": 0.01}}})
    try:
        if fixed:
            for src, n in fixed.items():
                dep.scale(src, n)
        clients = ([] if ranks is not None else
                   [pr.Client(cfg, rank=r, namespace=NS, name=name) for r in range(8)])
        n_steps = cfg["train_steps"]
        waits = np.zeros((n_steps, 8))
        barrier = threading.Barrier(8)
        sizes = []  # (time, step, {source: loaders})
        step_at = [0]
        stop = threading.Event()

        def monitor():
            while not stop.is_set():
                try:
                    v = dep.scaling()
                    sizes.append((time.monotonic(), step_at[0],
                                  {s["source"]: s["loaders"] if s["dedicated"] == 0 else
                                   s["dedicated"] for s in v["sources"]},
                                  {s["source"]: s["dedicated"] for s in v["sources"]}))
                except Exception:  # noqa: BLE001 - shut down
                    return
                stop.wait(0.25)

        def rank(r):
            c = clients[r]
            for t in range(n_steps):
                t0 = time.perf_counter()
                for _ in range(cfg["global_batch_size"] // 8):  # micro-batches of a step
                    b = c.next_batch()
                waits[t, r] = time.perf_counter() - t0
                del b
                time.sleep(args.compute)
                barrier.wait()
                if r == 0:
                    step_at[0] = t + 1

        mon = threading.Thread(target=monitor, daemon=True)
        if ranks is not None:
            # one process per rank (as data-parallel training runs): the ranks connect,
            # then all start together; the clock starts when they do
            for conn in ranks.conns:
                conn.send(("run", name, cfg, args.compute))
            ranks.start.wait(timeout=300)  # every rank connected, or BrokenBarrierError
            t_start = time.monotonic()
            mon.start()
            while any(not conn.poll(0.05) for conn in ranks.conns):
                step_at[0] = ranks.step.value
                if not all(p.is_alive() for p in ranks.procs):
                    raise RuntimeError("a rank process died (its stderr above)")
            for conn in ranks.conns:
                r, w_r = conn.recv()
                if isinstance(w_r, str):
                    raise RuntimeError(f"rank {r}: {w_r}")
                waits[:, r] = w_r
        else:
            t_start = time.monotonic()
            mon.start()
            threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        wall = time.monotonic() - t_start
        stop.set()
        mon.join()
        view = dep.scaling()
        acts = dep.actors  # every live loader, standbys too (the retired ones count both)
        profs = ray.get([a.profile.remote() for a in acts["source_loader"] + acts["shadow"]])
        for p in profs:  # the cluster is local: each loader's threads by CPU, from /proc
            p["threads_cpu_s"] = _threads_cpu(p.get("pid"))
        for c in clients:
            c.close()
    finally:
        dep.shutdown()
    step_wait = waits.max(axis=1)
    step_time = step_wait + args.compute
    frac = step_wait / step_time
    w = args.warmup
    around = slice(max(w, args.change - args.horizon), min(n_steps, args.change + args.horizon))
    # loader CPU-seconds reserved: dedicated loaders x loader_cpus x time, plus the
    # shared loaders the deployment started with (counted in both modes alike)
    reserved = 0.0
    for (t0, _s, _n, ded), (t1, *_rest) in zip(sizes, sizes[1:]):
        reserved += sum(ded.values()) * 1.0 * (t1 - t0)
    cost = {s["source"]: s["cost_per_token"] for s in view["sources"]}
    # the live loaders' CPU and that of the loaders retired during the run (their last
    # profile, kept by the autoscaler before it killed them)
    retired = [p for p in view.get("retired_loaders", []) if p.get("cpu_s") is not None]
    cpu_used = sum(p["cpu_s"] for p in profs) + sum(p["cpu_s"] for p in retired)
    # the run's own costs, measured in the source loaders over the whole run: per source,
    # the CPU of its reads and of its tokenizing (both timed per source in the loaders)
    # over the tokens delivered, live and retired loaders together
    work: dict = {}
    per_src = [{cfg["sources"][int(k)]["name"]: v for k, v in p["sources"].items()}
               for p in profs] + [p.get("sources") or {} for p in retired]
    for srcs in per_src:
        for name, v in srcs.items():
            acc = work.setdefault(name, [0.0, 0])
            acc[0] += v.get("read_cpu_s", 0.0) + v.get("tokenize_cpu_s", 0.0)
            acc[1] += v.get("tokens", 0)
    measured_cost = {n: (c / t if t else None) for n, (c, t) in work.items()}
    return {"mode": mode, "wall_s": wall, "steps": n_steps,
            "first_step_wait_s": float(step_wait[0]),
            "wait_p99_frac": float(np.percentile(frac[w:], 99)),
            "wait_p50_frac": float(np.percentile(frac[w:], 50)),
            "wait_max_frac_around_change": float(frac[around].max()) if n_steps > w else None,
            "wait_p99_frac_around_change": float(np.percentile(frac[around], 99)),
            "step_wait_s": step_wait.tolist(), "sizes": sizes, "cost": cost,
            "measured_cost": measured_cost,
            "reserved_cpu_s": reserved, "loader_cpu_used_s": cpu_used,
            # where the loaders' CPU went, per actor: all of it, its reads', and
            # per source the tokens delivered and tokenized for lengths calls
            "loader_profiles": [{"cpu_s": p["cpu_s"], "read_cpu_s": p["read_cpu_s"],
                                 "wall_s": p["wall_s"], "busy_s": p["busy_s"],
                                 "threads_cpu_s": p["threads_cpu_s"],
                                 "sources": {cfg["sources"][int(s)]["name"]: v
                                             for s, v in p["sources"].items()}}
                                for p in profs],
            "retired_loaders": view.get("retired_loaders", []),
            "decisions": view["decisions"], "final": view["sources"]}


def _threads_cpu(pid):
    """{thread name: CPU seconds} of a local process (summed over threads of one name),
    from /proc; {} where it cannot be read."""
    out = {}
    try:
        tick = os.sysconf("SC_CLK_TCK")
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, ValueError, TypeError):
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                st = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        rest = st[st.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(rest[11]) + int(rest[12])) / tick
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class RankProcs:
    """Eight trainer ranks, one process each (spawned once, reused by every run): a
    rank's waits are its own, as in data-parallel training, not those of eight threads
    taking turns on one interpreter lock.  ``conns``: a pipe per rank; ``start``: the
    start barrier (the ranks and this process); ``step``: rank 0's finished steps."""

    def __init__(self, address, mbs_per_rank):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.start = ctx.Barrier(9)
        self.step_barrier = ctx.Barrier(8)
        self.step = ctx.Value("i", 0)
        self.conns, self.procs = [], []
        for r in range(8):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_rank_main, daemon=True,
                            args=(r, address, mbs_per_rank, b, self.start,
                                  self.step_barrier, self.step))
            p.start()
            self.conns.append(a)
            self.procs.append(p)

    def close(self):
        for conn in self.conns:
            conn.send(("exit",))
        for p in self.procs:
            p.join(30)


def _rank_main(r, address, mbs_per_rank, conn, start, step_barrier, step):
    """A rank process: for each ("run", name, cfg, compute) it connects a Client to
    that deployment, waits at the start barrier, then for every step takes its
    micro-batches (the wait is timed), sleeps ``compute`` and meets the other ranks."""
    import numpy as np
    import ray

    ray.init(address=address, namespace=NS, log_to_driver=False)
    import polyload.ray as pr

    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        _, name, cfg, compute = msg
        n_steps = cfg["train_steps"]
        waits = np.zeros(n_steps)
        try:
            c = pr.Client(cfg, rank=r, namespace=NS, name=name)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            start.abort()
            conn.send((r, f"{type(e).__name__}: {e}"))
            continue
        start.wait(timeout=300)
        try:
            for t in range(n_steps):
                t0 = time.perf_counter()
                for _ in range(mbs_per_rank):
                    b = c.next_batch()
                waits[t] = time.perf_counter() - t0
                del b
                time.sleep(compute)
                step_barrier.wait(timeout=300)
                if r == 0:
                    step.value = t + 1
            c.close()
        except Exception as e:  # noqa: BLE001 - reported to the parent
            step_barrier.abort()
            conn.send((r, f"{type(e).__name__}: {e}"))
            continue
        conn.send((r, waits.tolist()))


class _Tokenize:
    """The Ray Data transform: the same tokenizer as the polyload sources (Hugging Face
    tokenizers, data/tokenizer.json, end-of-document appended), one thread."""

    def __init__(self, path):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)
        self.eos = self.tok.token_to_id("<|endoftext|>")

    def __call__(self, batch):
        import numpy as np

        enc = self.tok.encode_batch(list(batch["text"]))
        out = np.empty(len(enc), dtype=object)
        for i, e in enumerate(enc):
            out[i] = np.asarray(e.ids + [self.eos], dtype=np.int32)
        return {"ids": out}


class _Decode:
    """The Ray Data image transform: decode and resize to 224 x 224 (Pillow, bicubic),
    tokens = 256 placeholders (id 31999) + the caption's bytes."""

    def __call__(self, batch):
        import io

        import numpy as np
        from PIL import Image

        ids = np.empty(len(batch["__key__"]), dtype=object)
        for i in range(len(ids)):
            raw = next(batch[k][i] for k in ("jpg", "jpeg", "png", "webp")
                       if k in batch and isinstance(batch[k][i], (bytes, bytearray)))
            img = Image.open(io.BytesIO(raw)).convert("RGB").resize((224, 224),
                                                                     Image.BICUBIC)
            np.asarray(img)
            cap = batch["txt"][i] if "txt" in batch else b""
            cap = cap.encode() if isinstance(cap, str) else \
                bytes(cap) if isinstance(cap, (bytes, bytearray)) else b""
            ids[i] = np.concatenate([np.full(256, 31999, np.int32),
                                     np.frombuffer(cap, np.uint8).astype(np.int32)])
        return {"ids": ids}


def run_raydata(cfg, args):
    """Ray Data with actor-pool autoscaling (``ActorPoolStrategy(min_size=1,
    max_size=4)``) on the same transforms: the raw sources read with read_json and
    tokenized by a pool each, the pre-tokenized source's documents sliced from its
    .bin; the driver mixes them by the schedule (Ray Data has no mixture) and packs
    them into sequences, and feeds the 8 ranks through one queue per rank."""
    import queue

    import numpy as np
    import ray
    import ray.data as rd
    from ray.data import ActorPoolStrategy

    data = os.path.join(ROOT, "data")
    tok = os.path.join(data, "tokenizer.json")
    ctx = rd.DataContext.get_current()
    ctx.enable_progress_bars = False
    def tokenized(file):
        """Batches of the file's tokenized documents, endlessly (a new pass each time
        the dataset ends: Ray Data has no epochs of its own)."""
        while True:
            ds = rd.read_json(os.path.join(data, "raw", file))
            ds = ds.map_batches(_Tokenize, fn_constructor_args=(tok,), batch_size=16,
                                compute=ActorPoolStrategy(min_size=1, max_size=4),
                                num_cpus=1.0, resources={"cpu_node": 0.01})
            yield from ds.iter_batches(batch_size=16, batch_format="numpy",
                                       prefetch_batches=4)

    def images():
        """The photos decoded and resized to 224 x 224 (Pillow, as webdataset users do)
        by an actor pool, endlessly; each sample's tokens: 256 placeholders + caption."""
        import glob

        while True:
            ds = rd.read_webdataset(sorted(glob.glob(os.path.join(data, "vlm", "shard-*.tar"))),
                                    decoder=None)
            ds = ds.map_batches(_Decode, batch_size=4,
                                compute=ActorPoolStrategy(min_size=1, max_size=4),
                                num_cpus=1.0, resources={"cpu_node": 0.01})
            yield from ds.iter_batches(batch_size=4, batch_format="numpy", prefetch_batches=4)

    its = {"docs": tokenized("kernel_docs.jsonl"), "img": images()}
    # the pre-tokenized source: documents of the Megatron file, read with megatron-core
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    code = IndexedDataset(os.path.join(data, "python_src_text_document"))

    def code_docs():
        while True:
            for i in range(len(code)):
                yield {"ids": [np.asarray(code[i], dtype=np.int32)]}

    its["code"] = code_docs()
    seq, T = cfg["seq_length"], cfg["global_batch_size"] * cfg["seq_length"]
    pts = cfg["schedule"]["points"]
    n_steps = cfg["train_steps"]
    qs = [queue.Queue(maxsize=4) for _ in range(8)]
    bufs = {k: [] for k in its}
    have = {k: 0 for k in its}

    failure = []

    def mixer():
        try:
            produce()
        except BaseException as e:  # noqa: BLE001 - the ranks stop; main() reports it
            failure.append(f"{type(e).__name__}: {e}")
            for q in qs:
                q.put(None)

    def produce():
        for t in range(n_steps):
            w = pts[0]["weights"] if t < pts[1]["step"] else pts[1]["weights"]
            parts = []
            for s, it in its.items():
                want = int(round(w[s] * T))
                while have[s] < want:
                    b = next(it)
                    for ids in b["ids"]:
                        bufs[s].append(ids)
                        have[s] += len(ids)
                cat = np.concatenate(bufs[s]) if bufs[s] else np.zeros(0, np.int32)
                parts.append(cat[:want])
                rest = cat[want:]
                bufs[s], have[s] = ([rest] if len(rest) else []), len(rest)
            step = np.concatenate(parts)[:T]
            step = np.pad(step, (0, T - len(step)))
            per = step.reshape(8, -1)
            for r in range(8):
                qs[r].put(per[r])
        for q in qs:
            q.put(None)

    waits = np.zeros((n_steps, 8))
    barrier = threading.Barrier(8)
    pool = []
    stop = threading.Event()

    def monitor():
        from ray._private.state import actors  # the GCS's actor table (no dashboard)

        while not stop.is_set():
            try:
                pool.append((time.monotonic(), sum(
                    1 for a in actors().values() if a.get("State") == "ALIVE"
                    and "MapWorker" in (a.get("ActorClassName") or ""))))
            except Exception:  # noqa: BLE001
                pass
            stop.wait(0.5)

    def rank(r):
        for t in range(n_steps):
            t0 = time.perf_counter()
            x = qs[r].get()
            if x is None:
                return
            waits[t, r] = time.perf_counter() - t0
            del x
            time.sleep(args.compute)
            barrier.wait()

    t_start = time.monotonic()
    threads = [threading.Thread(target=mixer, daemon=True),
               threading.Thread(target=monitor, daemon=True)] + \
        [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for th in threads:
        th.start()
    for th in threads[2:]:
        th.join()
    wall = time.monotonic() - t_start
    stop.set()
    if failure:
        raise RuntimeError(f"Ray Data pipeline failed: {failure[0]}")
    reserved = sum(n0 * (t1 - t0) for (t0, n0), (t1, _n1) in zip(pool, pool[1:]))
    step_wait = waits.max(axis=1)
    frac = step_wait / (step_wait + args.compute)
    w = args.warmup
    around = slice(max(w, args.change - args.horizon), min(n_steps, args.change + args.horizon))
    return {"mode": "raydata", "wall_s": wall, "steps": n_steps,
            "first_step_wait_s": float(step_wait[0]),
            "wait_p99_frac": float(np.percentile(frac[w:], 99)),
            "wait_p50_frac": float(np.percentile(frac[w:], 50)),
            "wait_max_frac_around_change": float(frac[around].max()),
            "wait_p99_frac_around_change": float(np.percentile(frac[around], 99)),
            "step_wait_s": step_wait.tolist(), "pool": pool, "reserved_cpu_s": reserved,
            "cost": {}}


def ideal(cfg, args, cost, wall_per_step):
    """CPU-seconds an allocation sized exactly to the measured costs needs: per step,
    the fractional need sum_s w_s(t) T c_s, and the integer loaders ceil(need_s / step)
    each costly source needs for the step's duration."""
    T = cfg["global_batch_size"] * cfg["seq_length"]
    pts = cfg["schedule"]["points"]
    frac = integer = 0.0
    for t in range(cfg["train_steps"]):
        w = pts[0]["weights"] if t < pts[1]["step"] else pts[1]["weights"]
        for s, c in cost.items():
            if c is None:
                continue
            need = w[s] * T * c  # CPU-seconds of this step's work of s
            frac += need
            n = need / (1.0 * wall_per_step)
            integer += (0 if n < 0.5 else math.ceil(n)) * wall_per_step
    return frac, integer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--change", type=int, default=60)
    ap.add_argument("--horizon", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compute", type=float, default=0.25, help="simulated compute s/step")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--mbs", type=int, default=4, help="micro-batches per rank per step")
    ap.add_argument("--cpu-budget", type=float, default=2.0,
                    help="CPUs for dedicated loaders: the real cores (Ray's are logical here)")
    ap.add_argument("--no-raydata", action="store_true", help="skip the Ray Data run")
    ap.add_argument("--rank-threads", action="store_true",
                    help="run the 8 ranks as threads of this process (before: one process "
                         "per rank, as training runs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    for f in ("python_src_text_document.idx", "raw/kernel_docs.jsonl", "raw/man_i18n.jsonl",
              "tokenizer.json"):
        if not os.path.exists(os.path.join(ROOT, "data", f)):
            sys.exit(f"bench/ray/ray_autoscale.py: data/{f} is missing: run `make corpus` first")
    cfg = config(args)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 8, "object_store_memory": 512 * MiB, "include_dashboard": False,
        "resources": {"head_node": 1}})
    c.add_node(num_cpus=8, object_store_memory=256 * MiB, resources={"cpu_node": 1})
    c.add_node(num_cpus=8, object_store_memory=256 * MiB, resources={"cpu_node": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace=NS, log_to_driver=False)
    results = []
    ranks = None if args.rank_threads else RankProcs(c.address, cfg["global_batch_size"] // 8)
    try:
        for rnd in range(args.rounds):
            a = run_once("autoscale", cfg, args, ranks=ranks)
            T = cfg["global_batch_size"] * cfg["seq_length"]
            w0 = cfg["schedule"]["points"][0]["weights"]
            fixed = {}
            for s, cst in a["cost"].items():
                if cst is None:
                    continue
                need = w0[s] * T * cst / args.compute * 1.1
                fixed[s] = 0 if need < 0.5 else math.ceil(need)
            f = run_once("fixed", cfg, args, fixed=fixed, ranks=ranks)
            f["fixed"] = fixed
            runs = [a, f]
            if not args.no_raydata:
                runs.append(run_raydata(cfg, args))
            for r in runs:
                r["round"] = rnd
                fr, it = ideal(cfg, args, a["cost"], args.compute)
                r["ideal_fractional_cpu_s"], r["ideal_integer_cpu_s"] = fr, it
                # the ideal from the whole run's measured costs: the run's own, and (a
                # stricter one for the autoscaled run) the fixed pool's, whose one
                # loader read without other loaders beside it
                if r.get("measured_cost"):
                    r["ideal_measured_cpu_s"] = ideal(cfg, args, r["measured_cost"],
                                                      args.compute)[0]
                    r["ideal_fixed_costs_cpu_s"] = ideal(cfg, args, f["measured_cost"],
                                                         args.compute)[0]
                # when each pool reached its size after the change (autoscale only)
                if r["mode"] == "autoscale":
                    final = {s: r["sizes"][-1][3][s] for s in r["sizes"][-1][3]} if r["sizes"] else {}
                    reached = {}
                    for s, n in final.items():
                        for (_t, step, _l, ded) in r["sizes"]:
                            if ded.get(s) == n and n > 0:
                                reached[s] = step - args.change
                                break
                    r["reached_rel_change"] = reached
                results.append(r)
                print(f"round {rnd} {r['mode']:>9}: wall {r['wall_s']:.1f} s (first step waited "
                      f"{r['first_step_wait_s']:.1f} s), data wait p99 "
                      f"{r['wait_p99_frac']:.1%} of the step (p50 {r['wait_p50_frac']:.1%}, "
                      f"around the change max {r['wait_max_frac_around_change']:.1%}), "
                      f"loader CPU-s reserved {r['reserved_cpu_s']:.1f} vs ideal integer "
                      f"{it:.1f} / fractional {fr:.1f}, loader CPU-s used "
                      f"{r.get('loader_cpu_used_s', float('nan')):.2f} "
                      f"({r.get('loader_cpu_used_s', float('nan')) / fr:.2f}x fractional; "
                      f"{r.get('loader_cpu_used_s', float('nan')) / r.get('ideal_measured_cpu_s', float('nan')):.2f}x "
                      f"the ideal {r.get('ideal_measured_cpu_s', float('nan')):.1f} from the run's "
                      f"measured costs, "
                      f"{r.get('loader_cpu_used_s', float('nan')) / r.get('ideal_fixed_costs_cpu_s', float('nan')):.2f}x "
                      f"with the fixed run's), measured costs "
                      f"{ {k: (None if v is None else round(v * 1e6, 3)) for k, v in (r.get('measured_cost') or {}).items()} }, "
                      f"autoscaler's costs "
                      f"{ {k: (None if v is None else round(v * 1e6, 3)) for k, v in r['cost'].items()} } "
                      f"us/token" + (f", fixed {r.get('fixed')}" if r["mode"] == "fixed" else
                                     f", reached (steps rel. change) {r.get('reached_rel_change')}"
                                     if r["mode"] == "autoscale" else
                                     f", Ray Data pool sizes {sorted({n for _, n in r['pool']})}"),
                      flush=True)
    finally:
        if ranks is not None:
            ranks.close()
        ray.shutdown()
        c.shutdown()
    out = {"machine": machine_note(), "args": vars(args), "results": results}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    auto = [r for r in results if r["mode"] == "autoscale"]
    rd = [r["wait_p99_frac"] for r in results if r["mode"] not in ("autoscale", "fixed")]
    figures = []
    if auto:
        p99 = [100 * r["wait_p99_frac"] for r in auto]
        extra = {"lower_is_better": True, "headline": True,
                 "note": f"worst of {len(p99)} rounds; {min(p99):.1f}-{max(p99):.1f} %"}
        if rd:
            extra.update(peer="Ray Data ActorPoolStrategy(1, 4)",
                         peer_value=round(100 * max(rd), 1))
        figures.append(("Ray autoscaling, data wait p99 across a weight shift to image-text",
                        round(max(p99), 1), "% of step", extra))
        used = [r["loader_cpu_used_s"] / r["ideal_measured_cpu_s"] for r in auto
                if r.get("loader_cpu_used_s") and r.get("ideal_measured_cpu_s")]
        if used:
            figures.append(("Ray autoscaling, CPU used / the measured-cost ideal",
                            round(max(used), 2), "x",
                            {"lower_is_better": True, "note": f"worst of {len(used)} rounds; "
                             f"{min(used):.2f}-{max(used):.2f}x"}))
    if figures:
        print(save_results("ray_autoscale", figures))


if __name__ == "__main__":
    main()
