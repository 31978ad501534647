#!/usr/bin/env python3
"""Sources in object storage, side by side in one run on one local S3 server.

moto_server on 127.0.0.1 behind the fault-injecting proxy
(tests/remote/faultproxy.py), which counts every request by kind (LIST, HEAD,
GET of .idx, GET of .bin, ...) and its payload bytes; 0 and 20 ms added to
every request.  Every measured run is its own process (bench/remote/_child.py).

  startup   2,000 small Megatron datasets (4,000 objects) under one prefix,
            one source (the directory): seconds from creating the loader to
            the first batch, with the cache cold and then warm, and the
            requests each start makes.  polyload as it opens today (sizes and
            ETags from the listing, 64 opens at once) and as it opened before
            (a HEAD per object, 16 at once: POLYLOAD_REMOTE_LIST_ETAG=0,
            POLYLOAD_REMOTE_OPEN_THREADS=16), paired in each repeat.
  bytes     the throughput config (bench/embedded/throughput.py: four Megatron
            sources, the demo corpus) from an empty cache: payload bytes of
            .bin GETs at the proxy per byte of tokens the plan reads (the
            union of the plan's reads, from `polyload plan`), for a short run
            (20 steps, 8 % of the corpus) and for a run that reads the corpus
            about once (400 steps), per chunk size; counts, one run each.
  peers     on the same server and data: tokens/s, bytes moved and time to
            the first batch of polyload (the throughput config's first steps),
            megatron-core's S3 path (IndexedDataset with s3:// prefixes,
            ObjectStorageConfig; the same reads as polyload's plan) and MosaicML
            Streaming (StreamingDataset, its local cache; the same documents
            written as MDS shards); and the startup of the 2,000 datasets for
            megatron-core and Streaming.

Usage: .venv/bin/python bench/remote/compare.py [--repeats 3] [--files 2000]
       [--peer-steps 200] [--chunks 1048576,...] [--bytes-steps 20,400]
       [--no-write] [--only startup,bytes,peers]
Needs boto3 and moto[server] (the test extra) and, for the Streaming column,
mosaicml-streaming (.venv/bin/pip install mosaicml-streaming; its vision
module is not loaded, see _child.py).
Writes bench/results/remote_startup.json, remote_bytes.json and
remote_peers.json.
"""
import argparse
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "embedded"),
                os.path.join(ROOT, "tests", "remote")]
import results as bench_results  # noqa: E402
from s3env import S3Env  # noqa: E402
from throughput import SOURCES, write_polyload_config  # noqa: E402

PY = sys.executable
CHILD = os.path.join(HERE, "_child.py")
CLI = os.environ.get("POLYLOAD_CLI", os.path.join(ROOT, "build", "polyload"))
BUCKET = "pl-rbench"
SEQ = 1024
OLD_OPEN = {"POLYLOAD_REMOTE_LIST_ETAG": "0", "POLYLOAD_REMOTE_OPEN_THREADS": "16"}


def child(args, env, timeout=1800):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(args, f)
    try:
        p = subprocess.run([PY, CHILD, "@" + f.name], capture_output=True, text=True,
                           env=env, timeout=timeout, cwd=ROOT)
    finally:
        os.unlink(f.name)
    if p.returncode:
        raise RuntimeError(f"{args['reader']} exited {p.returncode}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measured(s3, latency, fn):
    """fn() with the proxy's counters reset first; (its result, the counts)."""
    s3.faults(reset=True, latency_ms=latency)
    r = fn()
    st = s3.stats()
    kinds = {k: v for k, v in st["kinds"].items()}
    return r, kinds


def kinds_line(kinds):
    return ", ".join(f"{k} {v['n']}" for k, v in sorted(kinds.items()))


def n_of(kinds, k):
    return kinds.get(k, {}).get("n", 0)


def bytes_of(kinds, *ks):
    return sum(kinds.get(k, {}).get("bytes", 0) for k in ks)


# ---------------------------------------------------------------- data

def write_megatron(prefix, lengths, base):
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ((base + np.arange(starts[-1], dtype=np.int64)) % 50000).astype(np.uint16).tofile(
        prefix + ".bin")
    n = len(lengths)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype="<u8").tobytes())
        f.write(bytes([8]))  # uint16
        f.write(np.array([n, n + 1], dtype="<u8").tobytes())
        f.write(lengths.astype("<i4").tobytes())
        f.write((starts[:-1] * 2).astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())


def make_many(d, files):
    """`files` small Megatron datasets: 8 to 40 documents of 16 to 400 tokens."""
    rng = np.random.default_rng(34)
    os.makedirs(d, exist_ok=True)
    prefixes = []
    for i in range(files):
        p = os.path.join(d, f"part_{i:05d}")
        write_megatron(p, rng.integers(16, 400, size=int(rng.integers(8, 40))), i * 1000)
        prefixes.append(p)
    return prefixes


def upload(s3, pairs):
    """[(local path, key)] uploaded straight to the server (not through the proxy)."""
    c = s3.client()
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda pk: c.upload_file(pk[0], BUCKET, pk[1]), pairs))


# ---------------------------------------------------------------- startup

def startup_config(cache):
    return {"seed": 1, "seq_length": SEQ, "global_batch_size": 8, "micro_batch_size": 8,
            "train_steps": 1000, "topology": {"dp": 1, "pp": 1, "cp": 1, "tp": 1},
            "threads": 2, "prefetch": 2,
            "sources": [{"name": "many", "type": "megatron",
                         "path": f"s3://{BUCKET}/many/", "weight": 1.0}],
            "cache": {"dir": cache, "max_bytes": 8 << 30}}


def bench_startup(s3, env, files, repeats):
    """Paired: in each repeat, each variant cold then warm, at 0 and 20 ms."""
    variants = {"polyload": {}, "polyload, HEAD per object (earlier open)": OLD_OPEN}
    rows = {}
    for rep in range(repeats):
        for lat in (0, 20):
            for name, extra in variants.items():
                cache = tempfile.mkdtemp(prefix="pl-rb-cache-")
                e = dict(env, **extra)
                for state in ("cold", "warm"):
                    r, kinds = measured(s3, lat, lambda: child(
                        {"reader": "polyload_first", "config": startup_config(cache)}, e))
                    rows.setdefault((name, lat, state), []).append(
                        {"s": r["first_batch_s"], "kinds": kinds})
                    print(json.dumps({"startup": name, "ms": lat, "cache": state, "rep": rep,
                                      "s": round(r["first_batch_s"], 3),
                                      "requests": kinds_line(kinds)}), flush=True)
                shutil.rmtree(cache, ignore_errors=True)
    return rows


# ---------------------------------------------------------------- bytes

def plan_reads(cfg, steps):
    """The plan's reads of steps [0, steps): {source: [(doc, offset, count)]}."""
    p = subprocess.run([CLI, "plan", cfg, "--steps", f"0:{steps}", "--json"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    out = {}
    for line in p.stdout.splitlines():
        for s in json.loads(line)["sequences"]:
            for src, doc, off, cnt in s["chunks"]:
                out.setdefault(src, []).append((doc, off, cnt))
    return out


def idx_pointers(prefix):
    with open(prefix + ".idx", "rb") as f:
        b = f.read()
    n = int(np.frombuffer(b[18:26], dtype="<u8")[0])
    return np.frombuffer(b[34 + 4 * n: 34 + 12 * n], dtype="<i8")


def union_bytes(reads, ptr, width=2):
    iv = sorted((int(ptr[d]) + o * width, int(ptr[d]) + (o + c) * width) for d, o, c in reads)
    total, end = 0, -1
    for a, b in iv:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def remote_throughput_config(local_cfg, cache, chunk, name):
    with open(os.path.join(ROOT, local_cfg)) as f:
        text = f.read()
    for _, path, _ in SOURCES:
        text = text.replace(f"path: {path},", f"path: s3://{BUCKET}/{path},")
    text += f"cache: {{dir: {cache}, max_bytes: {8 << 30}, chunk_bytes: {chunk}}}\n"
    out = os.path.join(os.path.dirname(os.path.join(ROOT, local_cfg)), name)
    with open(out, "w") as f:
        f.write(text)
    return os.path.relpath(out, ROOT)


def cli_run(cfg, steps, env):
    p = subprocess.run([CLI, "run", cfg, "--steps", str(steps), "--json", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"polyload run {cfg}: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def bench_bytes(s3, env, local_cfg, repeats, chunks, step_counts):
    ptrs = {name: idx_pointers(path) for name, path, _ in SOURCES}
    need = {}
    for steps in step_counts:
        reads = plan_reads(local_cfg, steps)
        need[steps] = sum(union_bytes(reads.get(name, []), ptrs[name]) for name in ptrs)
    rows = {}
    for rep in range(repeats):
        for chunk in chunks:
            for steps in step_counts:
                cache = tempfile.mkdtemp(prefix="pl-rb-cache-")
                cfg = remote_throughput_config(local_cfg, cache, chunk, "throughput_s3_bytes.yaml")
                r, kinds = measured(s3, 0, lambda: cli_run(cfg, steps, env))
                got = bytes_of(kinds, "GET .bin")
                rows.setdefault((chunk, steps), []).append(
                    {"ratio": got / need[steps], "bin_bytes": got, "plan_bytes": need[steps],
                     "gets": n_of(kinds, "GET .bin"), "tokens": r["tokens"]})
                print(json.dumps({"bytes": chunk, "steps": steps, "rep": rep,
                                  "ratio": round(got / need[steps], 3), "bin_bytes": got,
                                  "plan_bytes": need[steps]}), flush=True)
                shutil.rmtree(cache, ignore_errors=True)
    return rows


# ---------------------------------------------------------------- peers

def doc_tokens(prefix):
    """(lengths, pointers) of a Megatron dataset and its .bin as bytes."""
    with open(prefix + ".idx", "rb") as f:
        b = f.read()
    n = int(np.frombuffer(b[18:26], dtype="<u8")[0])
    lens = np.frombuffer(b[34:34 + 4 * n], dtype="<i4")
    ptrs = np.frombuffer(b[34 + 4 * n:34 + 12 * n], dtype="<i8")
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    return lens, ptrs, data


def write_mds(prefixes, out, size_limit):
    """Every document of the datasets as one MDS sample {"tokens": bytes}."""
    sys.modules.setdefault("streaming.vision", __import__("types").ModuleType("streaming.vision"))
    from streaming import MDSWriter
    with MDSWriter(out=out, columns={"tokens": "bytes"}, compression=None,
                   size_limit=size_limit) as w:
        for p in prefixes:
            lens, ptrs, data = doc_tokens(p)
            for ln, pt in zip(lens, ptrs):
                w.write({"tokens": data[int(pt):int(pt) + 2 * int(ln)]})


def tree_pairs(local_dir, prefix):
    out = []
    for root, _, files in os.walk(local_dir):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            out.append((p, f"{prefix}/{os.path.relpath(p, local_dir)}"))
    return out


def plan_batches(cfg, steps):
    """The plan of steps [0, steps), as megatron-core reads it: per step a list
    of [s3 prefix, document, offset, count]."""
    p = subprocess.run([CLI, "plan", cfg, "--steps", f"0:{steps}", "--json"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    prefix = {name: f"s3://{BUCKET}/{path}" for name, path, _ in SOURCES}
    out = {}
    for line in p.stdout.splitlines():
        j = json.loads(line)
        b = out.setdefault(j["step"], [])
        for s in j["sequences"]:
            for src, doc, off, cnt in s["chunks"]:
                b.append([prefix[src], doc, off, cnt])
    return [out[k] for k in sorted(out)]


def bench_peers(s3, env, local_cfg, many, repeats, steps, tmp):
    """Tokens/s, bytes moved, first batch: polyload, megatron-core, Streaming,
    each from an empty cache, paired in each repeat; then the 2,000-dataset
    start of each peer, cold and warm."""
    rows = {}
    batches = plan_batches(local_cfg, steps)
    plan_tokens = sum(c for b in batches for _, _, _, c in b)
    notes = {}
    menv = dict(env)
    senv = dict(env, S3_ENDPOINT_URL=s3.proxy_url)
    # MDS shards of the same documents (the throughput corpus; the 2,000 datasets).
    mds_ok = True
    try:
        write_mds([os.path.join(ROOT, p) for _, p, _ in SOURCES], os.path.join(tmp, "mds"),
                  8 << 20)
        upload(s3, tree_pairs(os.path.join(tmp, "mds"), "mds/corpus"))
        write_mds(many, os.path.join(tmp, "mds_many"), 8 << 20)
        upload(s3, tree_pairs(os.path.join(tmp, "mds_many"), "mds/many"))
    except Exception as e:  # noqa: BLE001 -- the reason goes into the record
        mds_ok = False
        notes["streaming"] = f"{type(e).__name__}: {e}"
    for rep in range(repeats):
        # The same polyload run from the files on disk: what the remote runs are
        # compared with.
        r = cli_run(local_cfg, steps, env)
        f = child({"reader": "polyload_first", "config": os.path.join(ROOT, local_cfg)}, env)
        rows.setdefault(("polyload, local disk", 0), []).append(
            {"tokens_per_s": r["tokens"] / r["seconds"], "first_batch_s": f["first_batch_s"],
             "bytes": 0, "kinds": {}, "tokens": r["tokens"]})
        print(json.dumps({"peers": "polyload, local disk", "rep": rep,
                          "tokens_per_s": round(r["tokens"] / r["seconds"]),
                          "first_batch_s": round(f["first_batch_s"], 3)}), flush=True)
        for lat in (0, 20):
            # polyload: the CLI builds every micro-batch of every rank for `steps`
            # steps; the first batch from the Python loader (rank 0).
            cache = tempfile.mkdtemp(prefix="pl-rb-cache-")
            cfg = remote_throughput_config(local_cfg, cache, 1 << 20, "throughput_s3_peers.yaml")
            r, kinds = measured(s3, lat, lambda: cli_run(cfg, steps, env))
            shutil.rmtree(cache, ignore_errors=True)
            cache = tempfile.mkdtemp(prefix="pl-rb-cache-")
            cfg = remote_throughput_config(local_cfg, cache, 1 << 20, "throughput_s3_peers.yaml")
            f, _ = measured(s3, lat, lambda: child({"reader": "polyload_first",
                                                     "config": os.path.join(ROOT, cfg)}, env))
            shutil.rmtree(cache, ignore_errors=True)
            rows.setdefault(("polyload", lat), []).append(
                {"tokens_per_s": r["tokens"] / r["seconds"], "first_batch_s": f["first_batch_s"],
                 "bytes": bytes_of(kinds, *kinds), "kinds": kinds, "tokens": r["tokens"]})
            print(json.dumps({"peers": "polyload", "ms": lat, "rep": rep,
                              "tokens_per_s": round(r["tokens"] / r["seconds"]),
                              "first_batch_s": round(f["first_batch_s"], 3),
                              "requests": kinds_line(kinds)}), flush=True)
            # megatron-core: the same reads.
            cache = tempfile.mkdtemp(prefix="pl-rb-mcore-")
            try:
                m, kinds = measured(s3, lat, lambda: child(
                    {"reader": "megatron", "cache": cache, "batches": batches}, menv))
                rows.setdefault(("megatron-core", lat), []).append(
                    {"tokens_per_s": m["tokens_per_s"], "first_batch_s": m["first_batch_s"],
                     "bytes": bytes_of(kinds, *kinds), "kinds": kinds,
                     "tokens": m["tokens_total"]})
                print(json.dumps({"peers": "megatron-core", "ms": lat, "rep": rep,
                                  "tokens_per_s": round(m["tokens_per_s"] or 0),
                                  "first_batch_s": round(m["first_batch_s"], 3),
                                  "requests": kinds_line(kinds)}), flush=True)
            except Exception as e:  # noqa: BLE001
                notes["megatron-core"] = str(e)[-600:]
            shutil.rmtree(cache, ignore_errors=True)
            # Streaming: as many tokens, in its order (its shards whole).
            if mds_ok:
                cache = tempfile.mkdtemp(prefix="pl-rb-mds-")
                nb = 1 << 30
                try:
                    m, kinds = measured(s3, lat, lambda: child(
                        {"reader": "streaming", "remote": f"s3://{BUCKET}/mds/corpus",
                         "cache": os.path.join(cache, "c"), "batch": 64, "batches": nb,
                         "tokens_max": plan_tokens}, senv))
                    rows.setdefault(("streaming", lat), []).append(
                        {"tokens_per_s": m["tokens_per_s"], "first_batch_s": m["first_batch_s"],
                         "bytes": bytes_of(kinds, *kinds), "kinds": kinds,
                         "tokens": m["tokens_total"]})
                    print(json.dumps({"peers": "streaming", "ms": lat, "rep": rep,
                                      "tokens_per_s": round(m["tokens_per_s"] or 0),
                                      "first_batch_s": round(m["first_batch_s"], 3),
                                      "requests": kinds_line(kinds)}), flush=True)
                except Exception as e:  # noqa: BLE001
                    notes["streaming"] = str(e)[-600:]
                shutil.rmtree(cache, ignore_errors=True)
    # The 2,000 datasets: each peer's start, cold then warm, 0 ms (once).
    first = [[f"s3://{BUCKET}/many/{os.path.basename(p)}", 0, 0, 16] for p in many[:8]]
    cache = tempfile.mkdtemp(prefix="pl-rb-mcore-")
    try:
        for state in ("cold", "warm"):
            m, kinds = measured(s3, 0, lambda: child(
                {"reader": "megatron", "cache": cache, "batches": [first], "open_all": True,
                 "prefixes": [f"s3://{BUCKET}/many/{os.path.basename(p)}" for p in many]},
                menv, timeout=3600))
            rows[("megatron-core startup", state)] = [{"first_batch_s": m["first_batch_s"],
                                                       "kinds": kinds}]
            print(json.dumps({"peers startup": "megatron-core", "cache": state,
                              "s": round(m["first_batch_s"], 2),
                              "requests": kinds_line(kinds)}), flush=True)
    except Exception as e:  # noqa: BLE001
        notes["megatron-core startup"] = str(e)[-600:]
    shutil.rmtree(cache, ignore_errors=True)
    if mds_ok:
        cache = tempfile.mkdtemp(prefix="pl-rb-mds-")
        try:
            for state in ("cold", "warm"):
                m, kinds = measured(s3, 0, lambda: child(
                    {"reader": "streaming", "remote": f"s3://{BUCKET}/mds/many",
                     "cache": os.path.join(cache, "c"), "batch": 8, "batches": 1}, senv))
                rows[("streaming startup", state)] = [{"first_batch_s": m["first_batch_s"],
                                                       "kinds": kinds}]
                print(json.dumps({"peers startup": "streaming", "cache": state,
                                  "s": round(m["first_batch_s"], 2),
                                  "requests": kinds_line(kinds)}), flush=True)
        except Exception as e:  # noqa: BLE001
            notes["streaming startup"] = str(e)[-600:]
        shutil.rmtree(cache, ignore_errors=True)
    return rows, notes, plan_tokens


# ---------------------------------------------------------------- main

def med(v):
    return statistics.median(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--only", default="startup,bytes,peers")
    ap.add_argument("--chunks", default="1048576,262144,65536,16384,4096",
                    help="chunk_bytes of the bytes figures")
    ap.add_argument("--bytes-steps", default="20,400", help="run lengths of the bytes figures")
    ap.add_argument("--peer-steps", type=int, default=200,
                    help="steps of the throughput config read by each peer")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    only = set(a.only.split(","))
    os.chdir(ROOT)
    for _, path, _ in SOURCES:
        for ext in (".bin", ".idx"):
            if not os.path.exists(path + ext):
                sys.exit(f"{path}{ext} missing: build the demo corpus first (make corpus)")
    cmd = (f".venv/bin/python bench/remote/compare.py --repeats {a.repeats} "
           f"--files {a.files}" + (f" --only {a.only}" if only != {"startup", "bytes", "peers"}
                                   else ""))
    local_cfg = write_polyload_config(1000000)
    tmp = tempfile.mkdtemp(prefix="pl-rbench-")
    table = []
    try:
        with S3Env() as s3:
            s3.bucket(BUCKET)
            env = dict(os.environ, **s3.environ)
            env.pop("POLYLOAD_CACHE_DIR", None)
            t0 = time.time()
            upload(s3, [(os.path.join(ROOT, p + ext), p + ext) for _, p, _ in SOURCES
                        for ext in (".bin", ".idx")])
            many = []
            if "startup" in only or "peers" in only:
                many = make_many(os.path.join(tmp, "many"), a.files)
                upload(s3, [(p + ext, f"many/{os.path.basename(p)}{ext}") for p in many
                            for ext in (".bin", ".idx")])
            print(json.dumps({"uploaded_s": round(time.time() - t0, 1)}), flush=True)
            records = {}
            if "startup" in only:
                rows = bench_startup(s3, env, a.files, a.repeats)
                records["remote_startup"] = startup_records(rows, a.files, cmd, table)
            if "bytes" in only:
                # Counts, not timings: one run each (they vary only by what the
                # prefetcher requests ahead of the last step).
                rows = bench_bytes(s3, env, local_cfg, 1,
                                   [int(x) for x in a.chunks.split(",")],
                                   [int(x) for x in a.bytes_steps.split(",")])
                records["remote_bytes"] = bytes_records(rows, cmd, table)
            if "peers" in only:
                rows, notes, ptok = bench_peers(s3, env, local_cfg, many, a.repeats,
                                                a.peer_steps, tmp)
                records["remote_peers"] = peer_records(rows, notes, ptok, a.peer_steps,
                                                       a.files, cmd, table)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    w = max(len(r[0]) for r in table) if table else 10
    for r in table:
        print(f"{r[0]:<{w}}  {r[1]}")
    if not a.no_write:
        for name, recs in records.items():
            bench_results.write(name, recs)


def startup_records(rows, files, cmd, table):
    recs = []
    for lat in (0, 20):
        for state in ("cold", "warm"):
            new = rows[("polyload", lat, state)]
            old = rows[("polyload, HEAD per object (earlier open)", lat, state)]
            v, ov = med([x["s"] for x in new]), med([x["s"] for x in old])
            k, ok = new[-1]["kinds"], old[-1]["kinds"]
            table.append((f"first batch, {files} Megatron datasets, {lat} ms, cache {state}",
                          f"{v:.2f} s (requests: {kinds_line(k)}); a HEAD per object: "
                          f"{ov:.2f} s ({kinds_line(ok)})"))
            recs.append(bench_results.record(
                f"seconds to the first batch, {files} remote Megatron datasets "
                f"({2 * files} objects), {lat} ms added per request, cache {state}",
                v, "s", command=cmd, lower_is_better=True,
                peer="the same, each object opened with a HEAD, 16 at once (the earlier open)",
                peer_value=ov,
                note=f"median of {len(new)} paired runs, each a new process; requests of a "
                     f"start: {kinds_line(k)} (a HEAD per object: {kinds_line(ok)}); "
                     "moto_server behind tests/remote/faultproxy.py on the same machine"))
    return recs


def peer_records(rows, notes, plan_tokens, steps, files, cmd, table):
    recs = []
    loc = rows.get(("polyload, local disk", 0))
    if loc:
        tps = med([x["tokens_per_s"] for x in loc])
        fb = med([x["first_batch_s"] for x in loc])
        table.append(("polyload, local disk", f"{tps / 1e6:.2f} M tokens/s, first batch {fb:.2f} s"))
        recs.append(bench_results.record(
            "remote peers: tokens/s of polyload from the same files on local disk", tps,
            "tokens/s", command=cmd,
            note=f"the CLI building every micro-batch of the throughput config (4 ranks) for "
                 f"{steps} steps, as the remote polyload rows; median of {len(loc)} runs; "
                 f"first batch {fb:.2f} s"))
    for lat in (0, 20):
        pl = rows.get(("polyload", lat))
        for name in ("polyload", "megatron-core", "streaming"):
            v = rows.get((name, lat))
            if not v:
                table.append((f"{name}, {lat} ms", f"did not run: {notes.get(name, '?')}"))
                continue
            tps = med([x["tokens_per_s"] for x in v if x["tokens_per_s"]] or [0])
            fb = med([x["first_batch_s"] for x in v])
            by = v[-1]["bytes"]
            tok = v[-1]["tokens"]
            table.append((f"{name}, {lat} ms, cache cold",
                          f"{tps / 1e6:.2f} M tokens/s, first batch {fb:.2f} s, "
                          f"{by / 1e6:.1f} MB moved for {tok * 2 / 1e6:.1f} MB of tokens "
                          f"({kinds_line(v[-1]['kinds'])})"))
            extra = {}
            if name == "polyload" and loc:
                extra = {"peer": "polyload, the same files on local disk",
                         "peer_value": med([x["tokens_per_s"] for x in loc])}
            if name != "polyload" and pl:
                extra = {"peer": "polyload, the same server and data",
                         "peer_value": med([x["tokens_per_s"] for x in pl])}
            what = {"polyload": f"the CLI building every micro-batch of the throughput "
                                f"config (4 ranks) for {steps} steps",
                    "megatron-core": "IndexedDataset with s3:// prefixes (ObjectStorageConfig: "
                                     ".idx downloaded to a local cache, .bin in 256 MiB ranged "
                                     "GETs kept in memory), reading the documents of the "
                                     f"same {steps}-step plan as numpy arrays (no packing, no "
                                     "batches built: polyload's figure builds them)",
                    "streaming": "StreamingDataset over the same documents written as MDS "
                                 "shards of 8 MB (its local cache, shards downloaded whole, "
                                 "its own order), as many tokens, samples as they come (no "
                                 "packing, no batches built)"}[name]
            recs.append(bench_results.record(
                f"remote peers: tokens/s of {name} from a local S3 server, {lat} ms added, "
                "cache cold", tps, "tokens/s", command=cmd,
                note=f"{what}; median of {len(v)} runs; first batch {fb:.2f} s; "
                     f"{by} bytes moved ({kinds_line(v[-1]['kinds'])}) for {tok} tokens "
                     f"({tok * 2} bytes); moto_server behind tests/remote/faultproxy.py on "
                     "the same machine", **extra))
    for name in ("megatron-core", "streaming"):
        for state in ("cold", "warm"):
            v = rows.get((f"{name} startup", state))
            if not v:
                msg = notes.get(f"{name} startup", notes.get(name, "?"))
                table.append((f"{name}: first batch, {files} datasets, cache {state}",
                              f"did not run: {msg}"))
                continue
            table.append((f"{name}: first batch, {files} datasets, cache {state}",
                          f"{v[0]['first_batch_s']:.2f} s ({kinds_line(v[0]['kinds'])})"))
            what = ("IndexedDataset opened for every prefix (its .idx downloaded each time, "
                    "a boto3 client per dataset and per .bin), then 8 documents read"
                    if name == "megatron-core" else
                    "StreamingDataset over the same documents as MDS shards of 8 MB, "
                    "its first 8 samples")
            recs.append(bench_results.record(
                f"remote peers: seconds to the first batch of {name}, {files} Megatron "
                f"datasets, 0 ms added, cache {state}", v[0]["first_batch_s"], "s",
                command=cmd, lower_is_better=True,
                note=f"{what}; one run; requests: {kinds_line(v[0]['kinds'])}; compare "
                     "the polyload figures of the same name"))
    for name, msg in notes.items():
        if not any(r["figure"].find(name) >= 0 for r in recs):
            print(f"note: {name}: {msg}", file=sys.stderr)
    return recs


def bytes_records(rows, cmd, table):
    recs = []
    for (chunk, steps), v in sorted(rows.items()):
        r = med([x["ratio"] for x in v])
        x = v[-1]
        table.append((f"bytes requested per byte read, chunk {chunk >> 10} KiB, {steps} steps",
                      f"{r:.3f} ({x['bin_bytes']} .bin bytes fetched, {x['plan_bytes']} read "
                      f"by the plan, {x['gets']} GETs)"))
        recs.append(bench_results.record(
            f"bytes requested per byte read, cache cold, throughput config, "
            f"{steps} steps, chunk_bytes {chunk}", r, "ratio", command=cmd,
            lower_is_better=True,
            note=f"payload of .bin GETs at the proxy ({x['bin_bytes']} bytes, {x['gets']} GETs) "
                 f"over the bytes of the plan's reads (their union, {x['plan_bytes']} bytes); "
                 "the .idx files and listings are left out (fetched once, kept)"))
    return recs


if __name__ == "__main__":
    main()
