#!/usr/bin/env python3
"""Raw text sources (issue 10): the loader's tokens/s against the tokenizer's own batch
encode, and time to first batch on a 1 GB JSON Lines source.

1. tokens per CPU-second (all threads of the process, getrusage): one jsonl source of
   real text (800 kernel_docs and 15,000 fortunes of the demo corpus, data/raw/),
   tokenized online by polyload.Loader (one tokenizer thread, one worker thread,
   RAYON_NUM_THREADS=1) for 2.9 epochs of batches, against
   ``Tokenizer.encode_batch_fast`` of the same documents in batches of 64 (the same
   tokenizer.json, RAYON_NUM_THREADS=1).  Paired rounds, alternating order.
2. time to first batch: the same JSONL repeated to >= 1 GB in a temporary file (no
   .plrec sidecar), from Loader() to the first micro-batch, warm page cache.

    RAYON_NUM_THREADS=1 .venv/bin/python bench/text_tokenize.py [--rounds 3]
"""
import argparse
import json
import os
import resource
import shutil
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
        for e in tok.encode_batch_fast(texts[i:i + 64], add_special_tokens=False):
            n += len(e.ids) + 1  # + eos, as the loader adds
    return n, cpu_s() - c


def config(path, tokenizer, steps):
    return {"seed": 1, "seq_length": 2048, "global_batch_size": 8, "micro_batch_size": 8,
            "train_steps": steps, "pad_id": 1, "threads": 1, "prefetch": 2,
            "topology": {"dp": 1},
            "sources": [{"name": "raw", "type": "jsonl", "path": path, "lookahead": 512,
                         "tokenizer": {"type": "hf", "path": tokenizer, "threads": 1}}]}


def loader(path, tokenizer, steps):
    c = cpu_s()
    with polyload.Loader(config(path, tokenizer, steps), rank=0) as ld:
        for _ in ld:
            pass
        tokens = ld.stats()["tokens"]
    return tokens, cpu_s() - c


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
        total, _ = peer(tok, texts)
        # The loader consumes about 2.9 epochs of the same documents (its lookahead stops
        # at each epoch's end, so what it tokenizes beyond what it consumes is < 1 %).
        steps = max(1, int(total * a.epochs) // (8 * 2048))
        print(f"{len(texts)} documents, {total} tokens; loader runs {steps} steps of "
              f"{8 * 2048} tokens", flush=True)
        rows = []
        for r in range(a.rounds):
            order = ("peer", "loader") if r % 2 == 0 else ("loader", "peer")
            res = {}
            for who in order:
                n, sec = peer(tok, texts) if who == "peer" else loader(src, tokenizer, steps)
                res[who] = n / sec
            rows.append(res)
            print(f"round {r}: tokenizer {res['peer']:.4g} tokens per CPU-s, loader "
                  f"{res['loader']:.4g} tokens per CPU-s, loader/tokenizer "
                  f"{res['loader'] / res['peer']:.3f}", flush=True)
        ratios = sorted(x["loader"] / x["peer"] for x in rows)
        print(f"median loader/tokenizer: {ratios[len(ratios) // 2]:.3f}", flush=True)
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
        for r in range(a.rounds):
            t = time.perf_counter()
            with polyload.Loader(config(big, tokenizer, 1), rank=0) as ld:
                next(iter(ld))
                first = time.perf_counter() - t
            print(f"round {r}: {gb:.2f} GB jsonl, time to first batch {first:.3f} s "
                  f"(sidecar present: {os.path.exists(big + '.plrec')})", flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
