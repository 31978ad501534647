#!/usr/bin/env python3
"""The client libraries that could carry polyload's requests, side by side on one server:
every byte of the demo corpus's Megatron .bin objects fetched by ranged GETs of --part
bytes, --threads at once, through the fault-injecting proxy with 0 and 20 ms added per
request, in alternating order, --repeats paired rounds.

  libcurl   build/remote_tool timed (src/source/remote/remote.c: libcurl's multi
            interface, SigV4 by CURLOPT_AWS_SIGV4, polyload's retry policy): what the
            loader uses; a thread per object, each its ranges at once (read_many), timed
            from after the objects are opened (as Arrow's files are opened before its
            clock)
  arrow     pyarrow.fs.S3FileSystem (Arrow C++'s S3 filesystem, AWS SDK for C++),
            read_at of each range on a thread pool
  boto3     boto3 get_object with Range, on a thread pool (the Python reference)

Figure: MB/s of payload (wall), each client's median, and libcurl / arrow per round.

    .venv/bin/python bench/remote/clients.py [--repeats 3] [--part 8388608] [--threads 16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "bench"), os.path.join(ROOT, "bench", "embedded"),
                os.path.join(ROOT, "tests", "remote")]
import results as bench_results  # noqa: E402
from s3env import S3Env  # noqa: E402
from throughput import SOURCES  # noqa: E402

BUCKET = "pl-clients"
TOOL = os.environ.get("PL_REMOTE_TOOL") or os.path.join(ROOT, "build", "remote_tool")


def ranges(objects, part):
    return [(k, o, min(part, n - o)) for k, n in objects for o in range(0, n, part)]


def run_libcurl(s3, objects, part, threads):
    env = dict(os.environ, **s3.environ, POLYLOAD_REMOTE_CONCURRENCY=str(threads))
    p = subprocess.run([TOOL, "timed", str(part), *(f"s3://{BUCKET}/{k}" for k, _ in objects)],
                       env=env, capture_output=True, timeout=600)
    if p.returncode:
        raise RuntimeError(p.stderr.decode()[-2000:])
    r = json.loads(p.stdout)
    return r["bytes"], r["seconds"]


def run_arrow(s3, objects, part, threads):
    import pyarrow.fs as pafs

    ep = s3.proxy_url.split("://", 1)[1]
    fs = pafs.S3FileSystem(access_key=s3.environ["AWS_ACCESS_KEY_ID"],
                           secret_key=s3.environ["AWS_SECRET_ACCESS_KEY"],
                           endpoint_override=ep, scheme="http", region="us-east-1")
    files = {k: fs.open_input_file(f"{BUCKET}/{k}") for k, _ in objects}

    def get(j):
        k, o, m = j
        return len(files[k].read_at(m, o))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        got = sum(ex.map(get, ranges(objects, part)))
    return got, time.perf_counter() - t0


def run_boto3(s3, objects, part, threads):
    c = s3.client(direct=False)

    def get(j):
        k, o, m = j
        return len(c.get_object(Bucket=BUCKET, Key=k, Range=f"bytes={o}-{o + m - 1}")
                   ["Body"].read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        got = sum(ex.map(get, ranges(objects, part)))
    return got, time.perf_counter() - t0


CLIENTS = {"libcurl": run_libcurl, "arrow": run_arrow, "boto3": run_boto3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part", type=int, default=8 << 20)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    os.chdir(ROOT)
    objects = [(p + ".bin", os.path.getsize(p + ".bin")) for _, p, _ in SOURCES]
    total = sum(n for _, n in objects)
    res = {}
    with S3Env() as s3:
        s3.bucket(BUCKET)
        c = s3.client()
        for k, _ in objects:
            c.upload_file(k, BUCKET, k)
        for lat in (0, 20):
            order = list(CLIENTS)
            for rnd in range(a.repeats):
                for name in (order if rnd % 2 == 0 else order[::-1]):
                    s3.faults(reset=True, latency_ms=lat)
                    got, sec = CLIENTS[name](s3, objects, a.part, a.threads)
                    assert got == total, (name, got, total)
                    res.setdefault((name, lat), []).append(total / sec / 1e6)
                print(json.dumps({f"{n}@{lat}": round(res[(n, lat)][-1], 1) for n in order}),
                      flush=True)
    cmd = (f".venv/bin/python bench/remote/clients.py --repeats {a.repeats} --part {a.part} "
           f"--threads {a.threads}")
    records = []
    print("\n| client | added latency | MB/s (median [range]) |\n|---|---|---|")
    for lat in (0, 20):
        for name in CLIENTS:
            v = res[(name, lat)]
            print(f"| {name} | {lat} ms | {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] |")
        r = [x / y for x, y in zip(res[("libcurl", lat)], res[("arrow", lat)])]
        records.append(bench_results.record(
            f"S3 client payload MB/s, libcurl (polyload's remote layer) / Arrow's "
            f"S3FileSystem, {lat} ms added per request", statistics.median(r), "x",
            command=cmd, peer="pyarrow.fs.S3FileSystem", peer_value=1.0,
            note=f"{total} bytes of the demo .bin objects in {a.part}-byte ranges, "
                 f"{a.threads} at once, through tests/remote/faultproxy.py to moto_server; "
                 "MB/s medians: " + ", ".join(
                     f"{n} {statistics.median(res[(n, lat)]):.1f}" for n in CLIENTS)
                 + f"; per-round ratios {', '.join(f'{x:.2f}' for x in r)}"))
    if not a.no_write:
        bench_results.write("remote_clients", records)


if __name__ == "__main__":
    main()
