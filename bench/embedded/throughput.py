#!/usr/bin/env python3
"""Steady-state non-padding tokens/s on the real corpus.

polyload: `build-bench/polyload run CONFIG --steps N --json --no-progress`,
CONFIG = examples/pretrain_mix.yaml with its schedule removed (constant
weights 0.4/0.3/0.2/0.1) and a large train_steps.  The CLI builds every
micro-batch of every DP rank (dp=4, 2 worker threads, prefetch 4) in its own
process and consumes them.  Its `seconds` starts after pl_loader_create
(sources opened) but includes filling the pipeline, so the steady state is
taken by differencing two runs of N_SHORT and N_LONG steps:
    (tokens_long - tokens_short) / (seconds_long - seconds_short).

peer: megatron-core BlendedDataset over four GPTDatasets on the same
.bin/.idx prefixes with the same weights and seq_length (2048), built with
BlendedMegatronDatasetBuilder + GPTDatasetConfig (create_attention_mask=False),
read through torch.utils.data.DataLoader(num_workers=2,
batch_size=micro_batch_size=2; variant "-inprocess": num_workers=0, for context).  The index cache is built first (timed
separately); then W warm-up batches, then M timed batches.  Tokens counted:
the `tokens` tensor elements that are not padding (loss_mask == 1 under
eod_mask_loss=False; GPTDataset pads nothing on the train split).

Usage: .venv/bin/python bench/embedded/throughput.py [--json OUT.json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import (OUT, ROOT, EodTokenizer, init_torch_distributed,  # noqa: E402
                     machine_note, megatron_quiet, proc_cpu_seconds, run_cli)
import results as bench_results  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "pretrain_mix.yaml")
SEQ_LENGTH = 2048
MICRO_BATCH = 2
SOURCES = [("kernel_docs", "data/kernel_docs_text_document", 0.4),
           ("python_src", "data/python_src_text_document", 0.3),
           ("man_i18n", "data/man_i18n_text_document", 0.2),
           ("fortunes", "data/fortunes_text_document", 0.1)]


def write_polyload_config(train_steps):
    """examples/pretrain_mix.yaml minus its schedule, with train_steps set."""
    with open(EXAMPLE) as f:
        text = f.read()
    text = text.split("\nschedule:", 1)[0] + "\n"
    text, n = re.subn(r"(?m)^train_steps:.*$", f"train_steps: {train_steps}", text)
    assert n == 1, "examples/pretrain_mix.yaml has no train_steps line"
    for name, path, w in SOURCES:
        assert re.search(rf"name: {name},.*path: {path},.*weight: {w}\}}", text), name
    assert f"seq_length: {SEQ_LENGTH}" in text and f"micro_batch_size: {MICRO_BATCH}" in text
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "throughput.yaml")
    with open(path, "w") as f:
        f.write(text)
    return os.path.relpath(path, ROOT)


def bench_polyload(n_short, n_long, repeats):
    cfg = write_polyload_config(max(n_long, 1000000))
    rows = []
    for _ in range(repeats):
        s, _, cpu_s = run_cli(["run", cfg, "--steps", str(n_short), "--json", "--no-progress"])
        l, _, cpu_l = run_cli(["run", cfg, "--steps", str(n_long), "--json", "--no-progress"])
        dt = l["seconds"] - s["seconds"]
        dtok = l["tokens"] - s["tokens"]
        rows.append({
            "steady_tokens_per_s": dtok / dt,
            "cli_tokens_per_s_long": l["tokens_per_s"],
            "steady_cpu_s_per_mtok": (cpu_l - cpu_s) / dtok * 1e6,
            "padding_fraction": l["padding_fraction"],
            "short": {k: s[k] for k in ("steps", "tokens", "seconds")},
            "long": {k: l[k] for k in ("steps", "tokens", "seconds")},
        })
    best = statistics.median(r["steady_tokens_per_s"] for r in rows)
    return {
        "config": cfg,
        "command": f"build-bench/polyload run {cfg} --steps {{{n_short},{n_long}}} --json --no-progress",
        "runs": rows,
        "steady_tokens_per_s": best,
        "cli_tokens_per_s_long": statistics.median(r["cli_tokens_per_s_long"] for r in rows),
        "steady_cpu_s_per_mtok": statistics.median(r["steady_cpu_s_per_mtok"] for r in rows),
    }


def build_megatron(n_samples, cache, variant):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    feature = variant.startswith("packed-equivalent")
    cfg = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ_LENGTH,
        blend=([os.path.join(ROOT, p) for _, p, _ in SOURCES], [w for _, _, w in SOURCES]),
        split="100,0,0",
        path_to_cache=cache,
        tokenizer=EodTokenizer(),
        reset_position_ids=feature,
        reset_attention_mask=False,
        eod_mask_loss=feature,
        create_attention_mask=False,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [n_samples, 0, 0], lambda: True, cfg).build()
    return train


def bench_megatron(warmup, timed, variant):
    import torch
    # import before timing, so that cache_build_s is the index build alone
    import megatron.core.datasets.blended_megatron_dataset_builder  # noqa: F401
    import megatron.core.datasets.gpt_dataset  # noqa: F401
    megatron_quiet()
    init_torch_distributed()
    torch.set_num_threads(1)
    cache = os.path.join(OUT, f"megatron_cache_{variant}")
    shutil.rmtree(cache, ignore_errors=True)
    n_samples = (warmup + timed) * MICRO_BATCH + 64
    t0 = time.perf_counter()
    build_megatron(n_samples, cache, variant)
    cold_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = build_megatron(n_samples, cache, variant)
    warm_build = time.perf_counter() - t0

    workers = 0 if variant.endswith("-inprocess") else 2
    loader = torch.utils.data.DataLoader(ds, batch_size=MICRO_BATCH, num_workers=workers,
                                         shuffle=False, drop_last=True)
    it = iter(loader)
    tokens = 0
    t_first = time.perf_counter()
    for _ in range(warmup):
        next(it)
    first_fill = time.perf_counter() - t_first
    pids = [w.pid for w in getattr(it, "_workers", [])] + [os.getpid()]
    cpu0 = sum(proc_cpu_seconds(p) for p in pids)
    padding = 0
    t0 = time.perf_counter()
    for _ in range(timed):
        b = next(it)
        n = b["tokens"].numel()
        if variant.startswith("default"):
            # loss_mask is 0 only on padding here (eod_mask_loss=False)
            real = int(b["loss_mask"].sum().item())
        else:
            real = n  # no padding on the train split; checked in 'default'
        padding += n - real
        tokens += real
    dt = time.perf_counter() - t0
    cpu1 = sum(proc_cpu_seconds(p) for p in pids)
    del it, loader
    return {
        "variant": variant,
        "num_workers": workers,
        "samples_built": n_samples,
        "cache_build_s": cold_build,
        "build_with_cache_s": warm_build,
        "warmup_batches": warmup,
        "warmup_s": first_fill,
        "timed_batches": timed,
        "timed_s": dt,
        "tokens": tokens,
        "padding_tokens": padding,
        "steady_tokens_per_s": tokens / dt,
        "steady_cpu_s_per_mtok": (cpu1 - cpu0) / tokens * 1e6,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps-short", type=int, default=500)
    ap.add_argument("--steps-long", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--megatron-warmup", type=int, default=200, help="batches")
    ap.add_argument("--megatron-timed", type=int, default=4000, help="batches")
    ap.add_argument("--variants", default="default,packed-equivalent,default-inprocess",
                    help="default: reset_position_ids/eod_mask_loss False (Megatron's "
                    "defaults, its fastest path); packed-equivalent: both True (per-document "
                    "positions and loss mask, as polyload delivers); -inprocess: "
                    "num_workers=0 instead of 2 (context only)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    os.chdir(ROOT)
    res = {"machine": machine_note()}
    res["polyload"] = bench_polyload(a.steps_short, a.steps_long, a.repeats)
    print(json.dumps({"polyload": res["polyload"]}, indent=1), flush=True)
    res["megatron"] = []
    for v in a.variants.split(","):
        timed = a.megatron_timed if v == "default" else max(a.megatron_timed // 2, 100)
        m = bench_megatron(a.megatron_warmup, timed, v)
        print(json.dumps({"megatron": m}, indent=1), flush=True)
        res["megatron"].append(m)
    p = res["polyload"]["steady_tokens_per_s"]
    cores = res["machine"]["cores"]
    print("\nsummary (steady state, non-padding tokens/s; %d cores):" % cores)
    print(f"  polyload            {p:14.4g}  ({p / cores:.4g} per core, "
          f"{res['polyload']['steady_cpu_s_per_mtok']:.4g} CPU-s per M tokens)")
    for m in res["megatron"]:
        t = m["steady_tokens_per_s"]
        print(f"  megatron {m['variant']:18s} w={m['num_workers']} {t:10.4g}  ({t / cores:.4g} per core, "
              f"{m['steady_cpu_s_per_mtok']:.4g} CPU-s per M tokens)  ratio {p / t:.1f}x; "
              f"cache build {m['cache_build_s']:.2f} s, rebuild from cache "
              f"{m['build_with_cache_s']:.2f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    peers = {m["variant"]: m["steady_tokens_per_s"] for m in res["megatron"]}
    figures = []
    for variant, figure, peer in (
            ("default", "C CLI, non-padding tokens/s, real corpus (4 DP ranks x 2 x 2048)",
             "megatron-core BlendedDataset + DataLoader, 2 workers"),
            ("default-inprocess",
             "C CLI, non-padding tokens/s, against megatron-core without worker processes",
             "megatron-core, num_workers=0")):
        if variant in peers:
            figures.append(bench_results.record(figure, p, "tokens/s", peer=peer,
                                                peer_value=peers[variant]))
    if figures:
        print(bench_results.write("embedded_throughput", figures))


if __name__ == "__main__":
    main()
