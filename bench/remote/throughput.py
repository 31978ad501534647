#!/usr/bin/env python3
"""Tokens/s from an S3-compatible server vs the same files on disk.

The throughput config (bench/embedded/throughput.py: examples/pretrain_mix.yaml
without its schedule, four Megatron sources) is run by the CLI three ways, side
by side in one run:
  local     the .bin/.idx files on disk
  s3        the same files uploaded to moto_server on 127.0.0.1, read through
            the fault-injecting proxy (tests/remote/faultproxy.py) with no
            added latency
  s3+20ms   the same with 20 ms added to every request by the proxy
Every remote run starts with an empty cache (cold) and its tokens/s is the
whole run's: tokens / seconds as the CLI reports them (after the loader is
created, the .idx files fetched), so every .bin byte the run reads is fetched
inside the timed part.  The demo corpus (about 32 MB) is small next to what
2,000 steps read, so the cold figure is a cold start followed by reads the
cache holds; a last run with the cache the previous run left shows the warm
case.  Requests and bytes are counted at the proxy.

Usage: .venv/bin/python bench/remote/throughput.py [--steps 2000] [--repeats 3]
       [--chunk-bytes N]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "embedded"),
                os.path.join(ROOT, "tests", "remote")]
import results as bench_results  # noqa: E402
from s3env import S3Env  # noqa: E402
from throughput import SOURCES, write_polyload_config  # noqa: E402

CLI = os.environ.get("POLYLOAD_CLI", os.path.join(ROOT, "build", "polyload"))
BUCKET = "pl-bench"


def run(cfg, steps, env):
    t0 = time.perf_counter()
    p = subprocess.run([CLI, "run", cfg, "--steps", str(steps), "--json", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode:
        sys.stderr.write(p.stderr)
        raise RuntimeError(f"polyload run {cfg} exited {p.returncode}")
    out = json.loads(p.stdout)
    out["wall_s"] = time.perf_counter() - t0
    return out


def remote_config(local_cfg, cache_dir, chunk):
    with open(os.path.join(ROOT, local_cfg)) as f:
        text = f.read()
    for _, path, _ in SOURCES:
        text = text.replace(f"path: {path},", f"path: s3://{BUCKET}/{path},")
    text += f"cache: {{dir: {cache_dir}, max_bytes: {8 << 30}, chunk_bytes: {chunk}}}\n"
    out = os.path.join(os.path.dirname(os.path.join(ROOT, local_cfg)), "throughput_s3.yaml")
    with open(out, "w") as f:
        f.write(text)
    return os.path.relpath(out, ROOT)


def measure(env_s3, cfg_fn, env, steps, repeats, latency):
    """Runs of `steps` steps, each with an empty cache, then one more with the
    cache the last one left (warm)."""
    rows = []
    warm = None
    for rep in range(repeats + 1):
        is_warm = rep == repeats
        if not is_warm:
            tmp = tempfile.mkdtemp(prefix="pl-bench-cache-")
        if env_s3 is not None:
            env_s3.faults(reset=True, latency_ms=latency)
        r = run(cfg_fn(tmp), steps, env)
        row = {k: r[k] for k in ("steps", "tokens", "seconds")}
        row["tokens_per_s"] = r["tokens"] / r["seconds"]
        if env_s3 is not None:
            st = env_s3.stats()
            row["proxy"] = {x: st[x] for x in ("GET", "HEAD", "bytes")}
            row["proxy"]["bin_bytes"] = st.get("kinds", {}).get("GET .bin", {}).get("bytes", 0)
        if is_warm:
            warm = row
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            rows.append(row)
            if rep < repeats - 1:
                shutil.rmtree(tmp, ignore_errors=True)
    return {"cold": rows, "warm": warm,
            "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rows)}


def ceiling(s3, objects, latency, threads=16, part=8 << 20):
    """(bytes, seconds) of fetching every byte of `objects` (key, size) through the
    proxy with `latency` ms added: ranged GETs of `part` bytes, `threads` at once, by a
    plain client (boto3) that only fetches: what this server can deliver."""
    from concurrent.futures import ThreadPoolExecutor

    c = s3.client(direct=False)
    jobs = [(k, o, min(part, n - o)) for k, n in objects for o in range(0, n, part)]

    def get(j):
        k, o, n = j
        body = c.get_object(Bucket=BUCKET, Key=k, Range=f"bytes={o}-{o + n - 1}")["Body"]
        return len(body.read())

    s3.faults(reset=True, latency_ms=latency)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        got = sum(ex.map(get, jobs))
    return got, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20)
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    os.chdir(ROOT)
    for _, path, _ in SOURCES:
        for ext in (".bin", ".idx"):
            if not os.path.exists(path + ext):
                sys.exit(f"{path}{ext} missing: build the demo corpus first (make corpus)")
    local_cfg = write_polyload_config(max(a.steps, 1000000))
    res = {}
    res["local"] = measure(None, lambda _: local_cfg, dict(os.environ), a.steps, a.repeats, 0)
    print(json.dumps({"local": res["local"]["tokens_per_s"]}), flush=True)
    with S3Env() as s3:
        s3.bucket(BUCKET)
        c = s3.client()
        for _, path, _ in SOURCES:
            for ext in (".bin", ".idx"):
                c.upload_file(path + ext, BUCKET, path + ext)
        env = dict(os.environ, **s3.environ)
        objects = [(path + ".bin", os.path.getsize(path + ".bin")) for _, path, _ in SOURCES]
        for name, lat in (("s3", 0), ("s3+20ms", 20)):
            res[name] = measure(s3, lambda d: remote_config(local_cfg, d, a.chunk_bytes), env,
                                a.steps, a.repeats, lat)
            cb = [ceiling(s3, objects, lat) for _ in range(a.repeats)]
            res[name]["ceiling"] = {"bytes": cb[0][0],
                                    "seconds": statistics.median(x[1] for x in cb)}
            print(json.dumps({name: res[name]["tokens_per_s"],
                              "ceiling": res[name]["ceiling"]}), flush=True)
    loc = res["local"]["tokens_per_s"]
    cmd = (f".venv/bin/python bench/remote/throughput.py --steps {a.steps} "
           f"--repeats {a.repeats} --chunk-bytes {a.chunk_bytes}")
    print(json.dumps(res, indent=1))
    records = [bench_results.record(
        "tokens/s, Megatron sources on local disk (remote bench baseline)", loc, "tokens/s",
        command=cmd)]
    for name, lat in (("s3", 0), ("s3+20ms", 20)):
        v = res[name]["tokens_per_s"]
        c0 = res[name]["cold"][0]
        w = res[name]["warm"]
        delivered = c0["tokens"] * 2  # uint16 corpus
        records.append(bench_results.record(
            f"tokens/s, Megatron sources from a local S3 server, {lat} ms added "
            "per request, cache cold", v, "tokens/s", command=cmd,
            peer="the same files on local disk", peer_value=loc,
            note=f"{v / loc:.0%} of local, whole {a.steps}-step runs from an empty cache "
                 f"(the corpus, {c0['proxy']['bytes']} bytes, is fetched in "
                 f"{c0['proxy']['GET']} GETs including the listings; "
                 f"{c0['proxy']['bytes'] / delivered:.2f} bytes requested per token byte "
                 f"delivered); a second run with the warm cache: "
                 f"{w['tokens_per_s'] / loc:.0%} of local, {w['proxy']['GET']} GETs; "
                 f"chunk {a.chunk_bytes} bytes; moto_server behind "
                 "tests/remote/faultproxy.py, on the same machine"))
    # How close the cold run comes to what the server allows: it cannot take less than
    # the local run's time, nor less than the server's time to deliver the bytes it
    # fetched (the ceiling client's rate); 1.0 means the loader hides every request.
    loc_s = statistics.median(x["seconds"] for x in res["local"]["cold"])
    for name, lat in (("s3", 0), ("s3+20ms", 20)):
        cl = res[name]["ceiling"]
        rate = cl["bytes"] / cl["seconds"]
        effs = []
        for row in res[name]["cold"]:
            bound = max(loc_s * row["tokens"] / res["local"]["cold"][0]["tokens"],
                        row["proxy"]["bin_bytes"] / rate)
            effs.append(bound / row["seconds"])
        v = statistics.median(effs)
        records.append(bench_results.record(
            f"cold remote run time's lower bound / its time, {lat} ms added per request "
            "(1 = the loader hides every request; the bound: the local run, or the server "
            "delivering the fetched bytes at its ceiling)", v, "ratio", command=cmd,
            note=f"ceiling: {cl['bytes']} bytes of the .bin objects in "
                 f"{cl['seconds']:.2f} s ({rate / 1e6:.0f} MB/s) by 16 boto3 threads of "
                 f"8 MiB ranged GETs through the same proxy; per-run values "
                 f"{', '.join(f'{e:.2f}' for e in effs)}"))
    if not a.no_write:
        bench_results.write("remote_throughput", records)


if __name__ == "__main__":
    main()
