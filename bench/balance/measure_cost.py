"""Measure step times of the tiny transformer for `polyload calibrate`.

Each row is one packed sequence of random documents (1..32 documents, total
tokens up to --max-tokens, lengths log-uniform from 16 up to the sequence
size), timed forward+backward (median of 3 after a warm-up), written as
    tokens,sum_sq,step_time
Then fit with `build-bal/polyload calibrate rows.csv --json`.

    .venv/bin/python bench/balance/measure_cost.py --rows 150 \
        --out bench/out/balance/cost_varlen.csv --attn varlen
"""
import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_model import TinyGPT, step_time  # noqa: E402


def random_row(rng, max_tokens):
    total = rng.randint(64, max_tokens)
    ndocs = rng.choice([1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    # log-uniform cut points: documents of very different lengths
    w = [math.exp(rng.uniform(0, 4)) for _ in range(ndocs)]
    s = sum(w)
    lens = [max(16, int(total * x / s)) for x in w]
    return lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--attn", choices=["varlen", "mask"], default="varlen")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    model = TinyGPT()
    for _ in range(3):  # warm-up
        step_time(model, [512, 512], a.attn, repeat=1, gen=gen)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write("tokens,sum_sq,step_time\n")
        f.write(f"# tiny transformer, attn={a.attn}, threads={a.threads}, "
                f"torch {torch.__version__}\n")
        for i in range(a.rows):
            lens = random_row(rng, a.max_tokens)
            t = step_time(model, lens, a.attn, repeat=3, gen=gen)
            f.write(f"{sum(lens)},{sum(l * l for l in lens)},{t:.6f}\n")
            f.flush()
    print(f"wrote {a.rows} rows to {a.out}")


if __name__ == "__main__":
    main()
