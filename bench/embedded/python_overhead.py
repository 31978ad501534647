#!/usr/bin/env python3
"""Overhead of the Python layer: polyload.Loader in a Python loop vs the C CLI.

Same config, same ranks (all DP ranks of the config, served by one loader), same steps:

- C:      `POLYLOAD_CLI run CONFIG --steps N --json --no-progress` (the CLI consumes each
          micro-batch with pl_loader_next and releases it, touching nothing);
- Python: `polyload.Loader(CONFIG, rank=0, ranks=all)` and `next_batch(r)` for every
          micro-batch of every rank, in step order; each batch is the dict of torch tensors a
          training loop gets (zero-copy views of the C memory), dropped right away, touching
          nothing either.  Two lower layers for the break-down: `_core.Loader.next` alone
          (a `Batch` handle, no arrays) and `next` + the five `Array` views.

Both are steady-state non-padding tokens/s by differencing two lengths (N_SHORT, N_LONG
steps): for the CLI two runs, as bench/embedded/throughput.py; for Python one run, reading the
loader's token counter at step N_SHORT and at N_LONG (the prefetched micro-batches counted
at both points cancel).  Runs alternate C / Python, `--repeats` times; medians reported.
Also by CPU time, which a loaded machine moves less than wall time: non-padding tokens per
CPU-second of the whole process over the same window (the CLI: the CPU time of the two
runs differenced; Python: os.times() at the two marks), and the CPU time per micro-batch
of the consuming thread (time.thread_time()).  With 2 loader threads on 2 cores the
consumer's CPU comes out of the builders', so the CPU ratio is the overhead of a loaded
machine too.

Configs: `throughput` is bench/embedded/throughput.py's (examples/pretrain_mix.yaml with constant
weights: dp 4, seq_length 2048, micro_batch_size 2, threads 2, prefetch 4); `1x8192` the
same with micro_batch_size 1 and seq_length 8192 (global_batch_size 64); `large-mb` with
micro_batch_size 8 and seq_length 8192 (global_batch_size 128), closer to what one
micro-batch of an LLM run holds.  The timed window (N_LONG - N_SHORT steps) is sized to
`--window` seconds of the C loader (estimated from a first short C run), so every window
lasts at least that long.

Usage: .venv/bin/python bench/embedded/python_overhead.py [--json OUT.json] [--profile]
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import CLI, OUT, ROOT, machine_note, run_cli  # noqa: E402
import results as bench_results  # noqa: E402
from throughput import write_polyload_config  # noqa: E402


def large_mb_config(base, seq_length=8192, micro_batch_size=8, global_batch_size=128,
                    name="python_overhead_large_mb.yaml"):
    with open(os.path.join(ROOT, base)) as f:
        text = f.read()
    for key, value in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size),
                       ("global_batch_size", global_batch_size)):
        text, n = re.subn(rf"(?m)^{key}:[^#\n]*", f"{key}: {value}  ", text)
        assert n == 1, key
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        f.write(text)
    return os.path.relpath(path, ROOT)


def python_loop(cfg, n_short, n_long, layer):
    import polyload

    loader = polyload.Loader(cfg, rank=0, ranks=range(polyload._core.Config.parse_file(cfg).world_size()))
    raw = loader._loader
    ranks = list(raw.ranks)
    c = loader.config
    nmb = c.get_int("global_batch_size") // (len(ranks) * c.get_int("micro_batch_size"))
    next_batch, raw_next = loader.next_batch, raw.next
    marks = {}
    for step in range(n_long + 1):
        if step in (n_short, n_long):
            pt = os.times()
            marks[step] = (time.perf_counter(), raw.stats()["tokens"], pt.user + pt.system,
                           time.thread_time())
            if step == n_long:
                break
        for _ in range(nmb):
            for r in ranks:
                if layer == "loader":
                    b = next_batch(r)
                elif layer == "core":
                    b = raw_next(r)
                else:  # core+arrays
                    b = raw_next(r)
                    (b.input_ids, b.labels, b.loss_mask, b.position_ids, b.cu_seqlens)
                del b
    loader.close()
    (t0, k0, c0, h0), (t1, k1, c1, h1) = marks[n_short], marks[n_long]
    mbs = (n_long - n_short) * nmb * len(ranks)
    return {"tokens_per_s": (k1 - k0) / (t1 - t0), "seconds": t1 - t0,
            "tokens_per_cpu_s": (k1 - k0) / (c1 - c0),
            "consumer_cpu_us_per_mb": 1e6 * (h1 - h0) / mbs, "micro_batches": mbs}


def cli_steady(cfg, n_short, n_long):
    s, _, cs = run_cli(["run", cfg, "--steps", str(n_short), "--json", "--no-progress"])
    l, _, cl = run_cli(["run", cfg, "--steps", str(n_long), "--json", "--no-progress"])
    return {"tokens_per_s": (l["tokens"] - s["tokens"]) / (l["seconds"] - s["seconds"]),
            "tokens_per_cpu_s": (l["tokens"] - s["tokens"]) / (cl - cs),
            "seconds": l["seconds"] - s["seconds"]}


def profile(cfg, n_steps):
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    python_loop(cfg, 0, n_steps, "loader")
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="throughput,1x8192,large-mb")
    ap.add_argument("--window", type=float, default=5.0,
                    help="seconds of the timed window at the C loader's speed")
    ap.add_argument("--layers", default="loader,core")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile the Python loop too")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    os.chdir(ROOT)
    base = write_polyload_config(1000000)
    configs = {"throughput": base, "large-mb": large_mb_config(base),
               "1x8192": large_mb_config(base, 8192, 1, 64, "python_overhead_1x8192.yaml")}
    res = {"machine": machine_note(), "cli": os.path.relpath(CLI, ROOT), "configs": {}}
    for name in a.configs.split(","):
        cfg = configs[name]
        # Window: a.window seconds at twice the C loader's probed speed (a probe on a
        # loaded machine runs slow), after a warm-up of 1/5 of it; the seconds of every
        # window are recorded (`window_seconds`).
        probe, _, _ = run_cli(["run", cfg, "--steps", "200", "--json", "--no-progress"])
        steps_per_s = 2 * probe["steps"] / probe["seconds"]
        ns = max(int(steps_per_s * a.window / 5), 10)
        nl = ns + max(int(steps_per_s * a.window), 50)
        layers = a.layers.split(",")
        rows = {"c": [], **{k: [] for k in layers}}
        secs = {k: [] for k in rows}
        cpu = {k: [] for k in rows}  # tokens per CPU-second of the whole process
        cons = {k: [] for k in layers}  # CPU-us per micro-batch of the consuming thread
        tokens_per_mb = []
        for _ in range(a.repeats):
            cr = cli_steady(cfg, ns, nl)
            rows["c"].append(cr["tokens_per_s"])
            secs["c"].append(cr["seconds"])
            cpu["c"].append(cr["tokens_per_cpu_s"])
            for layer in layers:
                r = python_loop(cfg, ns, nl, layer)
                rows[layer].append(r["tokens_per_s"])
                secs[layer].append(r["seconds"])
                cpu[layer].append(r["tokens_per_cpu_s"])
                cons[layer].append(r["consumer_cpu_us_per_mb"])
                tokens_per_mb.append(r["tokens_per_s"] * r["seconds"] / r["micro_batches"])
        med = {k: statistics.median(v) for k, v in rows.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        tpm = statistics.median(tokens_per_mb)
        c = med["c"]
        res["configs"][name] = {
            "config": cfg, "steps": [ns, nl], "runs": rows, "window_seconds": secs,
            "median_tokens_per_s": med,
            "paired_overhead": {k: [c_ / v - 1 for c_, v in zip(rows["c"], rows[k])]
                                for k in layers},
            "overhead_vs_c": {k: c / v - 1 for k, v in med.items() if k != "c"},
            "tokens_per_cpu_s": cpu, "median_tokens_per_cpu_s": med_cpu,
            "cpu_overhead_vs_c": {k: med_cpu["c"] / v - 1 for k, v in med_cpu.items()
                                  if k != "c"},
            "paired_cpu_overhead": {k: [c_ / v - 1 for c_, v in zip(cpu["c"], cpu[k])]
                                    for k in layers},
            "consumer_cpu_us_per_mb": cons,
            "tokens_per_micro_batch": tpm,
            "us_per_micro_batch": {k: 1e6 * tpm / v for k, v in med.items()},
        }
        print(f"{name} ({cfg}, {tpm:.0f} non-padding tokens per micro-batch): "
              f"median of {a.repeats}", flush=True)
        for k, v in med.items():
            extra = "" if k == "c" else f"   C / this - 1 = {100 * (c / v - 1):+.1f}%"
            print(f"  {k:12s} {v:10.4g} tokens/s  {1e6 * tpm / v:7.2f} us per micro-batch{extra}",
                  flush=True)
        for k, v in med_cpu.items():
            extra = "" if k == "c" else (
                f"   C / this - 1 = {100 * (med_cpu['c'] / v - 1):+.1f}% (rounds "
                + ", ".join(f"{100 * (x / y - 1):+.0f}%" for x, y in zip(cpu["c"], cpu[k]))
                + f"); consumer thread {statistics.median(cons[k]):.2f} CPU-us/mb")
            print(f"  {k:12s} {v:10.4g} tokens per CPU-s{extra}", flush=True)
        if a.profile:
            profile(cfg, nl // 2)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    figures = []
    for name, shape in (("throughput", "2 x 2048"), ("1x8192", "1 x 8192")):
        over = res["configs"].get(name, {}).get("overhead_vs_c", {})
        if "loader" in over:
            figures.append(bench_results.record(
                f"Python layer over the C loader, per micro-batch, {shape}",
                round(100 * over["loader"], 1), "%", lower_is_better=True,
                note=f"median of {a.repeats} paired repeats"))
    if figures:
        print(bench_results.write("embedded_python_overhead", figures))


if __name__ == "__main__":
    main()
