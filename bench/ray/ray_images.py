"""Images through the Ray deployment against the embedded loader: images/s and
pixel bytes per image crossing the object store, same config, same rank.

Config: the benchmark photos (``scripts/make_vlm_corpus.py --tile 4 --per-shard 32``: 130
real photos, 5 shards) in Qwen2-VL native mode (max_pixels 401408) at weight 0.5, mixed
with a flat text source, seq_length 4096, micro-batches of 2, 8 sequences a step, dp 1,
endless.  Paired rounds: each round runs the embedded loader (``polyload.Loader``,
``threads`` workers, decoding in this process) and then the deployment (``launch`` with
``loaders`` source-loader actors that decode, one constructor, one ``Client`` in this
process; a local Ray with 4 logical CPUs; ``prefetch_steps`` 2, so the queue is small
against the run).  Times exclude start-up and a warm-up of 4 micro-batches; images are
those of the micro-batches delivered.

    .venv/bin/python scripts/make_vlm_corpus.py --out data/vlm_bench --tile 4 --per-shard 32
    .venv/bin/python bench/ray/ray_images.py data/vlm_bench [--rounds 3] [--micro-batches 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import start_ray  # noqa: E402


def config(root, threads):
    return {"seed": 3, "seq_length": 4096, "global_batch_size": 8, "micro_batch_size": 2,
            "topology": {"dp": 1}, "threads": threads,
            "sources": [{"name": "img", "type": "webdataset", "weight": 0.5, "index": "memory",
                         "path": os.path.join(root, "shard-{000000..000004}.tar"),
                         "image": {"mode": "native", "token_id": 300, "max_pixels": 401408}},
                        {"name": "txt", "type": "flat", "weight": 0.5,
                         "path": os.path.join(root, "bench_text.bin")}]}


def consume(it, n):
    for _ in range(4):
        next(it)
    images = 0
    t0 = time.perf_counter()
    for _ in range(n):
        b = next(it)
        if "image_grid_thw" in b:
            images += int(b["image_grid_thw"].shape[0])
    return images, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loaders", type=int, default=2)
    ap.add_argument("--prefetch-steps", type=int, default=2,
                    help="the deployment's prefetch (steps), so that a round measures "
                         "sustained building, not a filled queue")
    args = ap.parse_args(argv)
    import ray

    import polyload
    import polyload.ray as pr
    pr.set_failure_detection_env()  # before ray.init below

    text = os.path.join(args.root, "bench_text.bin")
    if not os.path.exists(text):
        rng = np.random.default_rng(0)
        toks = []
        for _ in range(3000):
            toks.extend(rng.integers(1, 256, size=int(rng.integers(20, 800))).tolist())
            toks.append(0)
        np.asarray(toks, dtype=np.uint16).tofile(text)
    cfg = config(args.root, args.threads)
    start_ray(num_cpus=4, object_store_mib=256, namespace="bench_img")
    rows = []
    try:
        for r in range(args.rounds):
            with polyload.Loader(cfg, rank=0) as loader:
                n, dt = consume(iter(loader), args.micro_batches)
            rows.append({"round": r, "deployment": "embedded", "images": n,
                         "seconds": round(dt, 3), "images_per_s": round(n / dt, 1)})
            print(json.dumps(rows[-1]), flush=True)
            with pr.launch(cfg, num_source_loaders={"img": args.loaders, "txt": 1},
                           num_constructors=1, namespace="bench_img", name=f"r{r}",
                           prefetch_steps=args.prefetch_steps):
                with pr.Client(cfg, rank=0, namespace="bench_img", name=f"r{r}") as c:
                    b0 = c.package_bytes
                    n, dt = consume(iter(c), args.micro_batches)
                    nbytes = c.package_bytes - b0
            rows.append({"round": r, "deployment": "ray", "images": n,
                         "seconds": round(dt, 3), "images_per_s": round(n / dt, 1),
                         "package_bytes_per_image": round(nbytes / max(n, 1))})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
    med = {d: statistics.median(x["images_per_s"] for x in rows if x["deployment"] == d)
           for d in ("embedded", "ray")}
    ratios = [b["images_per_s"] / a["images_per_s"]
              for a, b in zip(rows[0::2], rows[1::2])]
    print(json.dumps({"summary": {"images_per_s": med,
                                  "ray_over_embedded_paired": [round(x, 2) for x in ratios]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
