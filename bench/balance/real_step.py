"""One real measurement: per-rank step time of the tiny transformer for the
plans of `balance: none` and a balancer, on the same documents.

Plans come from `polyload plan --json` (synthetic source, seq_length 2048,
dp 4, global batch 8*dp, micro_batch_size 1) with the cost model set to the
calibrated coefficients (bench/out/balance/cost_varlen.csv fitted by
`polyload calibrate`).  Each DP rank's step is simulated sequentially on this
CPU: forward+backward of each of its sequences (least of --repeat runs) (per-document causal
attention, tiny_model.py attn=varlen), summed.  Prints, per step, the
measured max-rank time of each plan and the ratio none/balanced beside the
cost model's predicted ratio (largest predicted rank time of each plan,
from the calibrated a, b, c; the planner gets max(c, 0), which does not
change its arrangement since every rank holds the same number of
sequences).

    .venv/bin/python bench/balance/real_step.py --steps 3
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_model import TinyGPT, step_time  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def plans(cli, balance, coef, a):
    cfg = (f"seed: 1234\nseq_length: {a.seq}\nglobal_batch_size: {8 * a.dp}\n"
           f"micro_batch_size: 1\nbalance: {balance}\n"
           f"cost: {{a: {coef['a']!r}, b: {coef['b']!r}, c: {max(coef['c'], 0.0)!r}}}\n"
           f"topology: {{dp: {a.dp}}}\nsources:\n"
           f"  - {{name: lognormal, type: megatron, path: {a.source}, weight: 1.0}}\n")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(cfg)
    out = subprocess.run([cli, "plan", f.name, "--steps", f"0:{a.steps}", "--json"],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    os.unlink(f.name)
    steps = {}
    for line in out.splitlines():
        j = json.loads(line)
        seqs = [[c[3] for c in s["chunks"]] for s in j["sequences"]]
        steps.setdefault(j["step"], {})[j["dp_rank"]] = (j["rank_cost"], seqs)
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build-bal/polyload"))
    ap.add_argument("--csv", default=os.path.join(ROOT, "bench/out/balance/cost_varlen.csv"))
    ap.add_argument("--source", default="data/synthetic/lognormal_text_document")
    ap.add_argument("--balance", default="karmarkar_karp")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    coef = json.loads(subprocess.run([a.cli, "calibrate", a.csv, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyGPT()
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        step_time(model, [1024, 1024], repeat=1, gen=gen)
    p = {b: plans(a.cli, b, coef, a) for b in ("none", a.balance)}
    print(f"calibrated: a={coef['a']:.4g} b={coef['b']:.4g} c={coef['c']:.4g} "
          f"r2={coef['r2']:.4f}; seq {a.seq}, dp {a.dp}, G {8 * a.dp}, mbs 1")
    print("| step | none max (s) | none predicted (s) | "
          f"{a.balance} max (s) | {a.balance} predicted (s) | measured ratio | predicted ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    tot = {b: [0.0, 0.0] for b in p}
    for s in range(a.steps):
        row = {}
        for b in p:
            meas, pred = [], []
            for r in range(a.dp):
                cost, seqs = p[b][s][r]
                meas.append(sum(step_time(model, lens, "varlen", a.repeat, gen, stat="min") for lens in seqs))
                # the calibrated model (c may be negative, which a config
                # does not accept, so it is applied here)
                pred.append(sum(coef["a"] * sum(lens) + coef["b"] * sum(x * x for x in lens)
                                + coef["c"] for lens in seqs))
            row[b] = (max(meas), max(pred))
            tot[b][0] += max(meas)
            tot[b][1] += max(pred)
        n, k = row["none"], row[a.balance]
        print(f"| {s} | {n[0]:.3f} | {n[1]:.3f} | {k[0]:.3f} | {k[1]:.3f} | "
              f"{n[0] / k[0]:.3f} | {n[1] / k[1]:.3f} |", flush=True)
    n, k = tot["none"], tot[a.balance]
    print(f"| all | {n[0]:.3f} | {n[1]:.3f} | {k[0]:.3f} | {k[1]:.3f} | "
          f"{n[0] / k[0]:.3f} | {n[1] / k[1]:.3f} |")


if __name__ == "__main__":
    main()
