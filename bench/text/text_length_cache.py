#!/usr/bin/env python3
"""Raw text length cache: the planner's view of a jsonl source, the lengths of
every document, on a fresh open without a ``<file>.pllen`` sidecar (tokenizing) and on a
second open with the sidecar the first one wrote (no tokenizing).

The source is 800 kernel_docs and 15,000 fortunes of the demo corpus (data/raw/), as in
bench/text/text_tokenize.py, copied to a temporary directory; tokenizer data/tokenizer.json
through ``tokenizers`` (RAYON_NUM_THREADS=1).

    RAYON_NUM_THREADS=1 .venv/bin/python bench/text/text_length_cache.py [--rounds 3]
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

import yaml  # noqa: E402

from polyload import _core  # noqa: E402


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def lengths(path, tokenizer):
    cfg = {"seq_length": 2048, "global_batch_size": 8, "micro_batch_size": 8,
           "sources": [{"name": "raw", "type": "jsonl", "path": path,
                        "tokenizer": {"type": "hf", "path": tokenizer}}]}
    src = _core.Config.parse_string(yaml.safe_dump(cfg), origin="bench").open_source(0)
    t, c = time.perf_counter(), cpu_s()
    total = sum(src.lengths(list(range(len(src)))))
    out = (time.perf_counter() - t, cpu_s() - c, total, src.num_tokenized)
    del src  # frees the source, which writes the sidecar if it was not written yet
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tokenizer = os.path.join(a.data, "tokenizer.json")
    tmp = tempfile.mkdtemp(prefix="pllen.")
    try:
        texts = []
        for name, n in (("kernel_docs", 800), ("fortunes", 15000)):
            with open(os.path.join(a.data, "raw", f"{name}.jsonl"), encoding="utf-8") as f:
                texts += [json.loads(x)["text"] for x in f if x.strip()][:n]
        src = os.path.join(tmp, "mix.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        for r in range(a.rounds):
            if os.path.exists(src + ".pllen"):
                os.unlink(src + ".pllen")
            cold = lengths(src, tokenizer)
            warm = lengths(src, tokenizer)
            assert cold[2] == warm[2]
            print(f"round {r}: {len(texts)} documents, {cold[2]} tokens: without sidecar "
                  f"{cold[0]:.3f} s ({cold[1]:.3f} CPU-s, {cold[3]} tokenized), with it "
                  f"{warm[0] * 1e3:.2f} ms ({warm[3]} tokenized), sidecar "
                  f"{os.path.getsize(src + '.pllen')} bytes", flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
