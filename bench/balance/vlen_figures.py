#!/usr/bin/env python3
"""Balancing where the imbalance is: long contexts, few sequences per rank, GPU costs.

Sources with the Pile-like document lengths (lognormal:
web mean 900 tokens sigma 1.1 weight 0.55; code 2,500 / 1.3 / 0.20; arxiv 14,000 / 0.6 /
0.15; books 90,000 / 0.7 / 0.10), written as Megatron indexes whose ``.bin`` is sparse
(the planner reads lengths only).  For seq_length 32,768, 1, 2 and 4 sequences per DP
rank (micro_batch_size 1) and dp 8, 64, 512, polyload plans ``--steps`` steps with

  none, karmarkar_karp, variable_length, variable_length + balance_window W

and every micro-batch of every rank is timed with the cost measured on an H200
(``h200_llama-3.2-1b_layer_cost.json``: one Llama-3.2-1B-shaped layer, forward+backward,
varlen FlashAttention): a micro-batch of documents l_i costs
16 * (a * sum l_i + b * sum l_i^2 + c) + the LM head (linear in tokens, measured at 8,192
and 32,768 tokens).  A rank's step is the sum of its micro-batches, the step its slowest
rank.  The trainer is assumed to drop a row's trailing padding (THD: the tokens up to the
last document's end; ``cu_seqlens[-2]``), so only documents cost.  The planner balances
with the same fitted cost (``cost: {a, b, c}`` of the full model).

Figures per setting: slowest rank / mean rank (ratio of sums over the steps), the step
time speedup over ``none`` (sum of step times), the bound (max of the mean rank and the
costliest single chunk, per step) as a speedup, the largest per-step mixture deviation,
and planning time per step (the planner's thread CPU time in ``Planner.next_plan``, one
thread; the window's amortized over its steps).

    .venv/bin/python bench/balance/vlen_figures.py --out bench/results/balance_vlen.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results as results_lib  # noqa: E402

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from _common import machine_note  # noqa: E402

import polyload  # noqa: E402,F401
from polyload import _core  # noqa: E402

GPU_JSON = os.path.join(ROOT, "bench", "balance", "h200_llama-3.2-1b_layer_cost.json")
SOURCES = (  # name, mean tokens, sigma, weight
    ("web", 900.0, 1.1, 0.55),
    ("code", 2500.0, 1.3, 0.20),
    ("arxiv", 14000.0, 0.6, 0.15),
    ("books", 90000.0, 0.7, 0.10),
)
LAYERS = 16


def write_source(prefix, mean, sigma, n, rng):
    """A Megatron index of n lognormal lengths (mean `mean`), sparse uint16 .bin."""
    mu = math.log(mean) - sigma * sigma / 2
    lengths = np.clip(np.rint(np.exp(rng.normal(mu, sigma, n))), 1, 1 << 21).astype(np.int32)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", n))
        f.write(struct.pack("<Q", n + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(2 * int(lengths.astype(np.int64).sum()))


def gpu_cost():
    """(per-layer a, b, c; head slope, intercept) from the H200 measurements (GPU_JSON)."""
    with open(GPU_JSON) as f:
        g = json.load(f)
    fit = g["fit_per_layer"]
    h = g["lm_head_and_loss_fwd_bwd_s"]
    slope = (h["32768"] - h["8192"]) / (32768 - 8192)
    icpt = h["8192"] - slope * 8192
    return fit["a_s_per_token"], fit["b_s_per_len2"], fit["c_s_per_micro_batch"], slope, icpt


def plan_config(data_dir, seq, dp, per_rank, mode, window, cost):
    a, b, c = cost
    cfg = {
        "seed": 1234, "seq_length": seq, "global_batch_size": dp * per_rank,
        "micro_batch_size": 1, "topology": {"dp": dp}, "long_documents": "split",
        "packing": "best_fit", "cost": {"a": a, "b": b, "c": c},
        "sources": [{"name": n, "type": "megatron", "path": os.path.join(data_dir, n),
                     "weight": w} for n, _m, _s, w in SOURCES],
    }
    if mode != "none":
        cfg["balance"] = mode
    if window > 1:
        cfg["balance_window"] = window
    import yaml

    return _core.Config.parse_string(yaml.safe_dump(cfg), origin="<bench>")


def step_times(plan, model):
    """Per-rank seconds of one plan under the GPU oracle, the bound, and the mixture."""
    la, lb, lc, hs, hc = model
    ch = np.asarray(plan["chunks"]).reshape(-1, 5)
    offs = np.asarray(plan["seq_offsets"])
    nseq = len(offs) - 1
    seq_of = np.repeat(np.arange(nseq), np.diff(offs))
    L = ch[:, 3].astype(np.float64)
    T = np.bincount(seq_of, weights=L, minlength=nseq)
    S2 = np.bincount(seq_of, weights=L * L, minlength=nseq)
    mb = LAYERS * (la * T + lb * S2 + lc) + hs * T + hc  # one row per micro-batch
    dp = plan["dp"]
    slots = np.asarray(plan["rank_sequences"]).reshape(dp, -1)
    rank = mb[slots].sum(axis=1)
    worst_chunk = float((LAYERS * (la * L + lb * L * L + lc) + hs * L + hc).max())
    return rank, max(float(rank.mean()), worst_chunk), ch


def run_setting(data_dir, seq, dp, per_rank, mode, window, steps, model, cost):
    cfg = plan_config(data_dir, seq, dp, per_rank, mode, window, cost)
    planner = _core.Planner.create(cfg)
    names = [n for n, *_ in SOURCES]
    weights = np.array([w for *_, w in SOURCES])
    tot_max = tot_mean = tot_bound = 0.0
    dev = 0.0
    plan_s = 0.0
    for _ in range(steps):
        t0 = time.thread_time()  # this thread's CPU: the planner runs in it
        plan_obj = planner.next_plan()
        plan_s += time.thread_time() - t0
        plan = plan_obj.to_dict()
        rank, bound, ch = step_times(plan, model)
        tot_max += float(rank.max())
        tot_mean += float(rank.mean())
        tot_bound += bound
        per = np.bincount(ch[:, 0], weights=ch[:, 3], minlength=len(names))
        dev = max(dev, float(np.abs(per / per.sum() - weights / weights.sum()).max()))
    return {"sum_step_s": tot_max, "sum_mean_rank_s": tot_mean, "sum_bound_s": tot_bound,
            "max_over_mean": tot_max / tot_mean, "mixture_deviation_max": dev,
            "plan_ms_per_step": 1000 * plan_s / steps}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "balance_vlen.json"))
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--dp", default="8,64,512")
    ap.add_argument("--per-rank", default="1,2,4")
    ap.add_argument("--documents", type=int, default=400_000)
    ap.add_argument("--data", default=None, help="directory for the sources (default: temp)")
    a = ap.parse_args()
    model = gpu_cost()
    la, lb, lc, hs, hc = model
    cost = (LAYERS * la + hs, LAYERS * lb, LAYERS * lc + hc)  # full model, per micro-batch
    tmp = None
    data_dir = a.data
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory()
        data_dir = tmp.name
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    for name, mean, sigma, _w in SOURCES:
        if not os.path.exists(os.path.join(data_dir, name + ".idx")):
            n = a.documents if mean < 10000 else max(a.documents // 20, 2000)
            write_source(os.path.join(data_dir, name), mean, sigma, n, rng)
    cmd = "python bench/balance/vlen_figures.py " + " ".join(sys.argv[1:])
    machine = machine_note()
    machine["host"] = socket.gethostname()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = []
    modes = [("none", 1), ("karmarkar_karp", 1), ("variable_length", 1),
             ("variable_length", a.window)]
    for dp in [int(x) for x in a.dp.split(",")]:
        for k in [int(x) for x in a.per_rank.split(",")]:
            base = None
            for mode, w in modes:
                r = run_setting(data_dir, a.seq, dp, k, mode, w, a.steps, model, cost)
                if base is None:
                    base = r
                label = mode + (f"+window{w}" if w > 1 else "")
                r["speedup_vs_none"] = base["sum_step_s"] / r["sum_step_s"]
                r["bound_speedup_vs_none"] = base["sum_step_s"] / base["sum_bound_s"]
                fig = f"seq{a.seq}_dp{dp}_per_rank{k}_{label}"
                print(f"{fig:55s} max/mean {r['max_over_mean']:.3f}  speedup "
                      f"{r['speedup_vs_none']:.3f}x (bound {r['bound_speedup_vs_none']:.3f}x)  "
                      f"mix dev {r['mixture_deviation_max']:.3f}  plan "
                      f"{r['plan_ms_per_step']:.1f} ms/step", flush=True)
                units = {"max_over_mean": "ratio", "speedup_vs_none": "x",
                         "bound_speedup_vs_none": "x", "mixture_deviation_max": "fraction",
                         "plan_ms_per_step": "ms"}
                setting = {"seq_length": a.seq, "dp": dp, "sequences_per_rank": k,
                           "mode": mode, "balance_window": w, "steps": a.steps,
                           "cost_oracle": "H200 per-micro-batch, 16 layers + LM head"}
                for key, unit in units.items():
                    rec = results_lib.record(
                        f"{fig}:{key}", r[key], unit, command=cmd,
                        note=json.dumps(setting, sort_keys=True),
                        lower_is_better=key in ("mixture_deviation_max", "plan_ms_per_step"))
                    results.append(rec)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(x) for x in results) + "\n]\n")  # one per line
    print(f"wrote {len(results)} figures to {a.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
