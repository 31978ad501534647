#!/usr/bin/env python3
"""Raw text sources: the loader's tokens/s against the tokenizer's own batch
encode, and time to first batch on a 1 GB JSON Lines source.

1. tokens per CPU-second (all threads of the process, getrusage): one jsonl source of
   real text (800 kernel_docs and 15,000 fortunes of the demo corpus, data/raw/),
   tokenized online by polyload.Loader (one tokenizer thread, one worker thread,
   RAYON_NUM_THREADS=1) for 2.9 epochs of batches, against
   ``Tokenizer.encode_batch_fast`` of the same documents in batches of 64 (the same
   tokenizer.json, RAYON_NUM_THREADS=1).  Paired rounds, alternating order.
2. time to first batch: the same JSONL repeated to >= 1 GB in a temporary file (no
   .plrec sidecar), from Loader() to the first micro-batch, warm page cache.

    RAYON_NUM_THREADS=1 .venv/bin/python bench/text/text_tokenize.py [--rounds 3]

--parquet adds a Parquet source of the same documents (pyarrow-written, row groups of
--row-group rows) to every round: the loader over it against the loader over the jsonl
file, paired.  --tokenizer-type tiktoken tokenizes with tiktoken instead (a .tiktoken file
converted from the same tokenizer.json, the GPT-2 pattern), the peer being
``Encoding.encode_ordinary_batch(batch, num_threads=1)`` in batches of 64.
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results as bench_results  # noqa: E402

import polyload  # noqa: E402
import torch  # noqa: E402,F401  a training process has it; Loader() would import it lazily
from tokenizers import Tokenizer  # noqa: E402


def texts_of(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def cpu_s():
    """CPU seconds of this process, all threads (user + system): robust to other
    processes on a shared machine, unlike wall time."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peer(tok, texts):
    c = cpu_s()
    n = 0
    for i in range(0, len(texts), 64):
        if isinstance(tok, Tokenizer):
            for e in tok.encode_batch_fast(texts[i:i + 64], add_special_tokens=False):
                n += len(e.ids) + 1  # + eos, as the loader adds
        else:  # tiktoken.Encoding
            for ids in tok.encode_ordinary_batch(texts[i:i + 64], num_threads=1):
                n += len(ids) + 1
    return n, cpu_s() - c


TOKENIZER = {"type": "hf"}


def config(path, tokenizer, steps, threads=1):
    kind = "parquet" if path.endswith(".parquet") else "jsonl"
    src = {"name": "raw", "type": kind, "path": path, "lookahead": 512,
           "tokenizer": dict(TOKENIZER, path=tokenizer, threads=threads)}
    if TOKENIZER["type"] == "tiktoken":
        src["eos_id"] = 0
    return {"seed": 1, "seq_length": 2048, "global_batch_size": 8, "micro_batch_size": 8,
            "train_steps": steps, "pad_id": 1, "threads": threads, "prefetch": 2,
            "topology": {"dp": 1}, "sources": [src]}


def loader(path, tokenizer, steps, threads=1, wall=False):
    c, t = cpu_s(), time.perf_counter()
    with polyload.Loader(config(path, tokenizer, steps, threads), rank=0) as ld:
        for _ in ld:
            pass
        tokens = ld.stats()["tokens"]
    return tokens, (time.perf_counter() - t) if wall else (cpu_s() - c)


def thread_scaling(src, tokenizer, steps, counts, rounds):
    """Wall tokens/s of the online source with `tokenizer.threads` = `threads` = T for
    each T in counts (the lookahead's tokenizing threads and the loader's workers),
    paired rounds in alternating order; speed-up against the first count."""
    rows = []
    for r in range(rounds):
        order = list(counts) if r % 2 == 0 else list(reversed(counts))
        res = {}
        for t in order:
            n, sec = loader(src, tokenizer, steps, threads=t, wall=True)
            res[t] = n / sec
        rows.append(res)
        print(f"round {r}: wall tokens/s " + ", ".join(
            f"{t} thread{'s' if t > 1 else ''} {res[t]:.4g}" for t in counts) +
            ", speed-up " + ", ".join(f"{res[t] / res[counts[0]]:.2f}x" for t in counts[1:]),
            flush=True)
    for t in counts[1:]:
        sp = sorted(x[t] / x[counts[0]] for x in rows)
        print(f"median speed-up {t} vs {counts[0]} threads: {sp[len(sp) // 2]:.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--kernel-docs", type=int, default=800)
    ap.add_argument("--fortunes", type=int, default=15000)
    ap.add_argument("--epochs", type=float, default=2.9)
    ap.add_argument("--no-first-batch", action="store_true",
                    help="only the tokens per CPU-second figure")
    ap.add_argument("--parquet", action="store_true",
                    help="also a Parquet source of the same documents, paired with jsonl")
    ap.add_argument("--row-group", type=int, default=1024, help="Parquet rows per row group")
    ap.add_argument("--tokenizer-type", choices=("hf", "tiktoken"), default="hf")
    ap.add_argument("--threads-scaling", default=None, metavar="T1,T2,...",
                    help="only: wall tokens/s with T tokenizer and worker threads, paired")
    a = ap.parse_args()
    tokenizer = os.path.join(a.data, "tokenizer.json")
    tmp = tempfile.mkdtemp(prefix="pltext.")
    try:
        src = os.path.join(tmp, "mix.jsonl")
        texts = []
        for name, n in (("kernel_docs", a.kernel_docs), ("fortunes", a.fortunes)):
            texts += texts_of(os.path.join(a.data, "raw", f"{name}.jsonl"))[:n]
        with open(src, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        tok = Tokenizer.from_file(tokenizer)
        if a.tokenizer_type == "tiktoken":
            from polyload._tiktoken import load_encoding, tokenizer_json_to_tiktoken
            tokenizer_json_to_tiktoken(tokenizer, os.path.join(tmp, "tok.tiktoken"))
            tokenizer = os.path.join(tmp, "tok.tiktoken")
            TOKENIZER.update(type="tiktoken", pat_str="r50k_base")
            tok = load_encoding(tokenizer, pat_str="r50k_base")[0]
        pqpath = None
        if a.parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq
            pqpath = os.path.join(tmp, "mix.parquet")
            pq.write_table(pa.table({"text": texts}), pqpath, row_group_size=a.row_group)
        total, _ = peer(tok, texts)
        # The loader consumes about 2.9 epochs of the same documents (its lookahead stops
        # at each epoch's end, so what it tokenizes beyond what it consumes is < 1 %).
        steps = max(1, int(total * a.epochs) // (8 * 2048))
        print(f"{len(texts)} documents, {total} tokens; loader runs {steps} steps of "
              f"{8 * 2048} tokens", flush=True)
        if a.threads_scaling:
            counts = [int(x) for x in a.threads_scaling.split(",")]
            # one epoch: every document is tokenized once (no length cache sidecar)
            thread_scaling(src, tokenizer, max(1, total // (8 * 2048)), counts, a.rounds)
            return
        rows = []
        for r in range(a.rounds):
            order = ["peer", "loader"] + (["parquet"] if pqpath else [])
            if r % 2:
                order.reverse()
            res = {}
            for who in order:
                n, sec = (peer(tok, texts) if who == "peer"
                          else loader(pqpath if who == "parquet" else src, tokenizer, steps))
                res[who] = n / sec
            rows.append(res)
            extra = (f", parquet loader {res['parquet']:.4g} tokens per CPU-s, parquet/jsonl "
                     f"{res['parquet'] / res['loader']:.3f}" if pqpath else "")
            print(f"round {r}: tokenizer {res['peer']:.4g} tokens per CPU-s, loader "
                  f"{res['loader']:.4g} tokens per CPU-s, loader/tokenizer "
                  f"{res['loader'] / res['peer']:.3f}{extra}", flush=True)
        ratios = sorted(x["loader"] / x["peer"] for x in rows)
        print(f"median loader/tokenizer: {ratios[len(ratios) // 2]:.3f}", flush=True)
        if a.tokenizer_type == "hf":
            lo = min(x["loader"] for x in rows)
            hi = max(x["loader"] for x in rows)
            print(bench_results.write("text_tokenize", [bench_results.record(
                "raw JSONL tokenized online: loader tokens per CPU-second / the tokenizer's "
                "alone", round(ratios[len(ratios) // 2], 3), "x", headline=True,
                note=f"median of {len(ratios)} paired rounds, {ratios[0]:.2f}-"
                     f"{ratios[-1]:.2f}; polyload.Loader {lo:.2g}-{hi:.2g} tokens/CPU-s")]))
        if pqpath:
            pr = sorted(x["parquet"] / x["loader"] for x in rows)
            print(f"median parquet/jsonl: {pr[len(pr) // 2]:.3f}", flush=True)
        if a.no_first_batch:
            return

        big = os.path.join(tmp, "big.jsonl")
        size = os.path.getsize(src)
        with open(src, "rb") as f:
            blob = f.read()
        with open(big, "wb") as f:
            for _ in range(int(a.gb * 2**30 / size) + 1):
                f.write(blob)
        gb = os.path.getsize(big) / 2**30
        bigpq = None
        if pqpath:
            import pyarrow as pa
            import pyarrow.parquet as pq
            bigpq = os.path.join(tmp, "big.parquet")
            reps = int(a.gb * 2**30 / size) + 1
            with pq.ParquetWriter(bigpq, pa.schema([("text", pa.string())])) as w:
                t = pa.table({"text": texts})
                for _ in range(reps):
                    w.write_table(t, row_group_size=a.row_group)
        firsts = []
        for r in range(a.rounds):
            t = time.perf_counter()
            with polyload.Loader(config(big, tokenizer, 1), rank=0) as ld:
                next(iter(ld))
                first = time.perf_counter() - t
            firsts.append(first)
            print(f"round {r}: {gb:.2f} GB jsonl, time to first batch {first:.3f} s "
                  f"(sidecar present: {os.path.exists(big + '.plrec')})", flush=True)
            if bigpq:
                t = time.perf_counter()
                with polyload.Loader(config(bigpq, tokenizer, 1), rank=0) as ld:
                    next(iter(ld))
                    first = time.perf_counter() - t
                print(f"round {r}: parquet of the same documents "
                      f"({os.path.getsize(bigpq) / 2**30:.2f} GB compressed), time to first "
                      f"batch {first:.3f} s", flush=True)
        if firsts and a.tokenizer_type == "hf":
            print(bench_results.write("text_tokenize", [bench_results.record(
                f"time to first batch, {gb:.2f} GB JSONL, no sidecar", round(max(firsts), 3),
                "s", lower_is_better=True,
                note=f"worst of {len(firsts)} rounds, {min(firsts):.2f}-{max(firsts):.2f} s")]))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
