#!/usr/bin/env python3
"""Cost of ``Loader(..., with_sources=True)``: microseconds per micro-batch of
``polyload.Loader.next_batch`` with and without the source fields (``segment_sources``,
``step``, ``micro_batch``), same config, same ranks, runs alternating, paired repeats.

Corpus: three synthetic Megatron sources written into bench/out/ (uint16, documents of
1..1500 tokens); config dp 4, seq_length 2048, micro-batches of 2, threads 2, prefetch 4,
as bench/embedded/python_overhead.py's ``throughput`` config.  Each run takes N micro-batches of
every rank after a warm-up and drops each dict right away.  There is no peer: this is an
option's cost against the same loader without it.

It also times ``Loader._to_dict`` alone on one retained batch (``dict_us_*``), the only
per-batch work the option adds in Python, which a loaded machine disturbs less.

Usage: .venv/bin/python bench/embedded/with_sources.py [--steps 300] [--repeats 5] [--json OUT]
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import OUT, machine_note  # noqa: E402


def corpus():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)
    prefixes = []
    for s in range(3):
        prefix = os.path.join(OUT, f"with_sources_src{s}")
        lengths = rng.integers(1, 1500, size=4000).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        rng.integers(2, 32000, size=int(starts[-1]), dtype=np.uint16).tofile(prefix + ".bin")
        with open(prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1))
            f.write(lengths.astype(np.int32).tobytes())
            f.write((starts[:-1] * 2).astype(np.int64).tobytes())
            f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
        prefixes.append(prefix)
    return {"seed": 1, "seq_length": 2048, "global_batch_size": 32, "micro_batch_size": 2,
            "topology": {"dp": 4}, "threads": 2, "prefetch": 4, "pad_id": 0,
            "sources": [{"name": f"s{i}", "type": "megatron", "path": p, "weight": w}
                        for i, (p, w) in enumerate(zip(prefixes, (0.5, 0.3, 0.2)))]}


def run(cfg, with_sources, steps):
    import polyload

    with polyload.Loader(cfg, rank=0, ranks=[0, 1, 2, 3], with_sources=with_sources) as ld:
        nmb = 32 // (4 * 2)
        nb = ld.next_batch
        for _ in range(20 * nmb):  # warm-up
            for r in range(4):
                nb(r)
        t0 = time.perf_counter()
        for _ in range(steps * nmb):
            for r in range(4):
                nb(r)
        return (time.perf_counter() - t0) / (steps * nmb * 4) * 1e6


def dict_cost(cfg, n):
    """Microseconds per ``_to_dict`` of one retained Batch, without and with the source
    fields: the only per-batch work the option adds in Python (C fills segment_sources
    either way), measured on one thread so the loader's threads do not interfere."""
    import polyload

    with polyload.Loader(cfg, rank=0, threads=1) as ld:
        b = ld._handle().next(0)
        conv = ld._converter(0)
        out = []
        for flag in (False, True):
            # without: the dict next_batch builds (Loader.next_dict does the same
            # to_dict in C); with: that dict plus the source fields (Loader._to_dict)
            if flag:
                f = lambda: ld._to_dict(b, conv)  # noqa: E731
            else:
                f = lambda: b.to_dict(conv[0], writable=conv[1], dlpack=conv[2])  # noqa: E731
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            out.append((time.perf_counter() - t0) / n * 1e6)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg = corpus()
    off, on = [], []
    for _ in range(a.repeats):
        off.append(run(cfg, False, a.steps))
        on.append(run(cfg, True, a.steps))
    ratios = [b / x for x, b in zip(off, on)]
    d = [dict_cost(cfg, 20000) for _ in range(a.repeats)]
    res = {"dict_us_off": statistics.median(x[0] for x in d),
           "dict_us_on": statistics.median(x[1] for x in d),
           "dict_us_added_paired_median": statistics.median(x[1] - x[0] for x in d),
           "us_per_microbatch_off": statistics.median(off),
           "us_per_microbatch_on": statistics.median(on),
           "paired_ratio_median": statistics.median(ratios),
           "off": off, "on": on, "machine": machine_note()}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
