#!/usr/bin/env python3
"""Non-padding tokens/s delivered to a PyTorch loop: polyload.Loader vs megatron-core.

Same data and shapes as bench/embedded/throughput.py (the corpus of scripts/build_corpus.py, four
Megatron datasets, constant weights 0.4/0.3/0.2/0.1, seq_length 2048, micro-batches of 2):

- polyload: `polyload.Loader(bench/out/throughput.yaml, rank=0, ranks=[0, 1, 2, 3])`, one
  loader serving all 4 DP ranks in this process (2 C worker threads, prefetch 4), and
  `next_batch(r)` for every micro-batch of every rank in step order;
- megatron-core: `torch.utils.data.DataLoader(BlendedDataset of GPTDatasets, batch_size=2,
  num_workers=W)` for each W of `--megatron-workers` (default 2 and 0: with worker
  processes, and reading in the loop's own process), built by bench/embedded/throughput.py's `build_megatron` (Megatron's default
  flags: reset_position_ids=False, eod_mask_loss=False; create_attention_mask=False).

The loop touches every tensor of every micro-batch the same way on both sides: it sums
input_ids (`tokens`), labels, loss_mask and position_ids, and counts non-padding tokens
(polyload: input_ids != pad_id; megatron: loss_mask == 1, which is 0 only on padding under
eod_mask_loss=False).  W warm-up micro-batches (worker start-up, pipeline fill), then T timed
ones; `--repeats` runs of each, medians reported.

Usage: .venv/bin/python bench/embedded/torch_loop.py [--json OUT.json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import OUT, ROOT, init_torch_distributed, machine_note, megatron_quiet  # noqa: E402
import results as bench_results  # noqa: E402
from throughput import MICRO_BATCH, build_megatron, write_polyload_config  # noqa: E402


def polyload_loop(cfg, warmup, timed):
    import torch

    import polyload

    loader = polyload.Loader(cfg, rank=0, ranks=range(4))
    pad = loader.config.get_int("pad_id")
    ranks = list(range(4))
    it = (r for _ in iter(int, 1) for r in ranks)  # 0, 1, 2, 3, 0, 1, ...
    touched = torch.zeros((), dtype=torch.float64)
    tokens = 0
    for i in range(warmup + timed):
        if i == warmup:
            t0 = time.perf_counter()
            tokens = 0
        b = loader.next_batch(next(it))
        ids = b["input_ids"]
        tokens += int((ids != pad).sum())
        touched += ids.sum() + b["labels"].sum() + b["loss_mask"].sum() + b["position_ids"].sum()
    dt = time.perf_counter() - t0
    loader.close()
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
            "micro_batches": timed, "checksum": float(touched)}


def megatron_loop(warmup, timed, workers=2):
    import torch

    import megatron.core.datasets.blended_megatron_dataset_builder  # noqa: F401
    megatron_quiet()
    init_torch_distributed()
    torch.set_num_threads(1)
    cache = os.path.join(OUT, "megatron_cache_torch_loop")
    shutil.rmtree(cache, ignore_errors=True)
    ds = build_megatron((warmup + timed) * MICRO_BATCH + 64, cache, "default")
    loader = torch.utils.data.DataLoader(ds, batch_size=MICRO_BATCH, num_workers=workers,
                                         shuffle=False, drop_last=True)
    it = iter(loader)
    touched = torch.zeros((), dtype=torch.float64)
    tokens = 0
    for i in range(warmup + timed):
        if i == warmup:
            t0 = time.perf_counter()
            tokens = 0
        b = next(it)
        tokens += int(b["loss_mask"].sum())
        touched += b["tokens"].sum() + b["labels"].sum() + b["loss_mask"].sum() + \
            b["position_ids"].sum()
    dt = time.perf_counter() - t0
    del it, loader
    # The one-process group megatron-core wants would make polyload.Loader of the next
    # round check its 4-rank topology against a world of 1: take it down.
    torch.distributed.destroy_process_group()
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
            "micro_batches": timed, "checksum": float(touched), "num_workers": workers}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=200, help="micro-batches")
    ap.add_argument("--polyload-timed", type=int, default=20000, help="micro-batches")
    ap.add_argument("--megatron-timed", type=int, default=2000, help="micro-batches")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--megatron-workers", default="2,0",
                    help="DataLoader num_workers values of the peer")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    os.chdir(ROOT)
    cfg = write_polyload_config(1000000)
    workers = [int(w) for w in a.megatron_workers.split(",")]
    res = {"machine": machine_note(), "config": cfg, "polyload": [],
           "megatron": {w: [] for w in workers}}
    for _ in range(a.repeats):  # paired: polyload, then each peer variant, per round
        res["polyload"].append(polyload_loop(cfg, a.warmup, a.polyload_timed))
        print(json.dumps({"polyload": res["polyload"][-1]}), flush=True)
        for w in workers:
            res["megatron"][w].append(megatron_loop(a.warmup, a.megatron_timed, w))
            print(json.dumps({"megatron": res["megatron"][w][-1]}), flush=True)
    p = statistics.median(r["tokens_per_s"] for r in res["polyload"])
    res["median"] = {"polyload": p}
    print(f"\nnon-padding tokens/s into a PyTorch loop (median of {a.repeats}): polyload {p:.4g}")
    for w in workers:
        m = statistics.median(r["tokens_per_s"] for r in res["megatron"][w])
        res["median"][f"megatron_workers_{w}"] = m
        res["median"][f"ratio_workers_{w}"] = p / m
        print(f"  megatron-core DataLoader(num_workers={w}) {m:.4g}, ratio {p / m:.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    note = f"median of {a.repeats} paired rounds"
    figures = []
    for w, figure, peer, head in (
            (0, "non-padding tokens/s into the same PyTorch loop",
             "megatron-core DataLoader, no worker processes", True),
            (2, "non-padding tokens/s into the same PyTorch loop, peer with 2 workers",
             "megatron-core DataLoader, 2 workers", None)):
        if w in workers:
            figures.append(bench_results.record(
                figure, p, "tokens/s", peer=peer, headline=head, note=note,
                peer_value=res["median"][f"megatron_workers_{w}"]))
    print(bench_results.write("embedded_torch_loop", figures))


if __name__ == "__main__":
    main()
