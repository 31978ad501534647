"""Write the long-tail synthetic source of the balancing benchmark.

A Megatron indexed dataset (megatron-core MMapIndexedDataset v1, uint16
tokens) whose document lengths are lognormal with mean about 1,000 tokens,
clipped to [1, 65536] (sigma 1.5; mu chosen so that the clipped mean is 1,000).
The planner reads lengths only, so the .bin is written as a sparse file of
zero tokens: its apparent size is 2 bytes per token, its disk use is a few
blocks.  `--real-tokens` writes random tokens instead (for small datasets).

    .venv/bin/python bench/balance/make_synthetic.py \
        --out data/synthetic/lognormal_text_document --documents 2200000
"""
import argparse
import math
import os
import struct

import numpy as np

SIGMA = 1.5
MEAN = 1000.0
CAP = 65536


def clipped_mean(mu, sigma, cap):
    """E[min(max(X, 1), cap)] for X lognormal(mu, sigma), by quadrature."""
    z = np.linspace(-8, 8, 200001)
    x = np.clip(np.exp(mu + sigma * z), 1, cap)
    w = np.exp(-z * z / 2)
    return float((x * w).sum() / w.sum())


def solve_mu(sigma=SIGMA, mean=MEAN, cap=CAP):
    lo, hi = 0.0, math.log(mean) + 1
    for _ in range(60):
        mid = (lo + hi) / 2
        if clipped_mean(mid, sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="prefix of .idx/.bin")
    ap.add_argument("--documents", type=int, default=2_200_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--real-tokens", action="store_true")
    ap.add_argument("--vocab", type=int, default=1024)
    a = ap.parse_args()
    mu = solve_mu()
    rng = np.random.default_rng(a.seed)
    lengths = np.exp(rng.normal(mu, SIGMA, a.documents))
    lengths = np.clip(np.rint(lengths), 1, CAP).astype(np.int32)
    pointers = np.zeros(a.documents, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", a.documents))
        f.write(struct.pack("<Q", a.documents + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(a.documents + 1, dtype=np.int64).tobytes())
    total = int(lengths.astype(np.int64).sum())
    with open(a.out + ".bin", "wb") as f:
        if a.real_tokens:
            for s in range(0, total, 1 << 24):
                n = min(1 << 24, total - s)
                f.write(rng.integers(1, a.vocab, n, dtype=np.uint16).tobytes())
        else:
            f.truncate(2 * total)  # sparse
    print(f"{a.out}: {a.documents} documents, {total} tokens, mean "
          f"{total / a.documents:.1f}, p50 {int(np.median(lengths))}, "
          f"p99 {int(np.percentile(lengths, 99))}, max {int(lengths.max())} "
          f"(mu {mu:.4f}, sigma {SIGMA})")


if __name__ == "__main__":
    main()
